// One walk of a JSON text as it arrives measures both what is refused before it is parsed: its nesting
// (with the top-level member being read when it goes too deep) and the items of a request's lists and maps
// along its list tree; wherever the pieces are cut, and whatever the strings hold.
import { describe, expect, it } from "vitest";
import { JsonScanner } from "../../src/http/json-scan.js";
import type { JsonListNode } from "../../src/shared/list-bounds.js";

const list = (max: number, element?: JsonListNode): JsonListNode => ({ kind: "list", max, element });
const message = (fields: Record<string, [string, JsonListNode]>): JsonListNode => {
  const members = new Map<string, { name: string; node: JsonListNode }>();
  for (const [name, [jsonName, node]] of Object.entries(fields)) {
    members.set(name, { name, node });
    members.set(jsonName, { name, node });
  }
  return { kind: "message", members };
};
// {items: [{sub_items: [..2]}..2], tags: {..2}}
const tree = message({
  items: ["items", list(2, message({ sub_items: ["subItems", list(2)] }))],
  tags: ["tags", { kind: "map", max: 2, element: undefined }],
});

/** What the scanner says of `text` fed in two pieces cut at `cut`: too deep (and the member), the list refusal. */
function scan(text: string, maxDepth: number, cut: number) {
  const bytes = Buffer.from(text);
  const s = new JsonScanner(maxDepth, tree);
  const deep = s.exceeds(bytes.subarray(0, cut)) || s.exceeds(bytes.subarray(cut));
  return { deep, member: s.member(), lists: s.listRefusal() };
}

describe("the JSON scanner", () => {
  it("counts the lists and maps along the tree, by proto or JSON name, escapes read, strings skipped", () => {
    const cases: [string, string | undefined][] = [
      ['{"items":[1,2]}', undefined],
      ['{"items":[1,2,3]}', "items must hold at most 2 items"],
      ['{"\\u0069tems": [ "]", "[,", "\\"" ]}', "items must hold at most 2 items"],
      ['{"other":[1,2,3],"s":"{\\"items\\":[1,2,3]}"}', undefined],
      ['{"items":[{"subItems":[1,[2,3,4]]},{"sub_items":[{"a":[1,2,3]},2,3]}]}', "items.sub_items must hold at most 2 items"],
      ['{"tags":{"a":[1,2,3],"b":{"x":1,"y":2,"z":3}}}', undefined],
      ['{"tags":{"a":1,"b":2,"c":3}}', "tags must hold at most 2 items"],
      ['[{"items":[1,2,3]}]', undefined],
    ];
    for (const [text, refusal] of cases) {
      for (let cut = 0; cut <= Buffer.byteLength(text); cut++) {
        expect(scan(text, 100, cut), `${text} cut at ${cut}`).toEqual({ deep: false, member: undefined, lists: refusal });
      }
    }
  });

  it("measures the depth in the same walk, and goes on measuring it past a list over its bound", () => {
    const cases: [string, number, { deep: boolean; member?: string; lists?: string }][] = [
      ['{"items":[1,2,3],"x":[[[1]]]}', 3, { deep: true, member: "x", lists: "items must hold at most 2 items" }],
      ['{"items":[[[[1]]],2,3]}', 3, { deep: true, member: "items" }],
      ['{"items":[1,2,3],"x":[[1]]}', 3, { deep: false, lists: "items must hold at most 2 items" }],
    ];
    for (const [text, max, expected] of cases) {
      for (let cut = 0; cut <= Buffer.byteLength(text); cut++) {
        expect(scan(text, max, cut), `${text} cut at ${cut}`).toEqual({ deep: expected.deep, member: expected.member, lists: expected.lists });
      }
    }
  });
});

describe("the first top-level member", () => {
  /** What a scanner that reads no further than it says of `text`, fed in two pieces cut at `cut`: whether it knows, and the name. */
  function first(text: string, cut: number) {
    const bytes = Buffer.from(text);
    const s = JsonScanner.firstMemberReader();
    s.exceeds(bytes.subarray(0, cut));
    s.exceeds(bytes.subarray(cut));
    return { known: s.firstKnown, name: s.firstMember() };
  }

  it("is the first member's name, escapes read, wherever the pieces are cut; none where the text is no object with a member", () => {
    const long = "\\u0061".repeat(22); // 132 bytes of text: no field's name
    const cases: [string, { known: boolean; name?: string }][] = [
      ['{"heartbeat":{"gpuStatus":[[[[1]]]]}}', { known: true, name: "heartbeat" }],
      [' \n{ "\\u0068eart\\"beat" : 1, "result": {}}', { known: true, name: 'heart"beat' }],
      ['{"result', { known: false }],
      ["{ ", { known: false }],
      ["{}", { known: true }],
      ['{,"heartbeat":1}', { known: true }],
      ['[{"heartbeat":1}]', { known: true }],
      ['"heartbeat"', { known: true }],
      [`{"${long}":1}`, { known: true }],
      [`{"${"\\u0061".repeat(21)}":1}`, { known: true, name: "a".repeat(21) }],
    ];
    for (const [text, expected] of cases) {
      for (let cut = 0; cut <= Buffer.byteLength(text); cut++) {
        expect(first(text, cut), `${text} cut at ${cut}`).toEqual({ known: expected.known, name: expected.name });
      }
    }
  });

  it("is read in the same walk as the depth and the lists, which it does not change", () => {
    const text = '{"items":[1,2,3],"x":[[[1]]]}';
    const s = new JsonScanner(3, tree);
    expect(s.exceeds(Buffer.from(text))).toBe(true);
    expect({ known: s.firstKnown, name: s.firstMember(), member: s.member(), lists: s.listRefusal() }).toEqual({
      known: true,
      name: "items",
      member: "x",
      lists: "items must hold at most 2 items",
    });
  });
});
