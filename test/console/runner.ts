// The --runner program of the console test's daemon: reports 40% progress,
// waits until the test lets it go (a file appears), then writes a PNG result.
import fs from "node:fs";
import path from "node:path";
import { writeExecutable } from "../daemon/helpers.js";

/** A tiny PNG encoder (RGB, no filter), enough for a real image the browser decodes. */
export const PNG_SOURCE = String.raw`
const zlib = require("node:zlib");
function crc32(buf) {
  let c, crc = 0xffffffff;
  for (let n = 0; n < buf.length; n++) {
    c = (crc ^ buf[n]) & 0xff;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    crc = (crc >>> 8) ^ c;
  }
  return (crc ^ 0xffffffff) >>> 0;
}
function chunk(type, data) {
  const len = Buffer.alloc(4); len.writeUInt32BE(data.length);
  const td = Buffer.concat([Buffer.from(type), data]);
  const crc = Buffer.alloc(4); crc.writeUInt32BE(crc32(td));
  return Buffer.concat([len, td, crc]);
}
function png(w, h) {
  const raw = Buffer.alloc((w * 3 + 1) * h);
  for (let y = 0; y < h; y++) for (let x = 0; x < w; x++) {
    const o = y * (w * 3 + 1) + 1 + x * 3;
    raw[o] = (x * 255) / w; raw[o + 1] = (y * 255) / h; raw[o + 2] = 160;
  }
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(w, 0); ihdr.writeUInt32BE(h, 4); ihdr[8] = 8; ihdr[9] = 2;
  return Buffer.concat([Buffer.from([137, 80, 78, 71, 13, 10, 26, 10]), chunk("IHDR", ihdr), chunk("IDAT", zlib.deflateSync(raw)), chunk("IEND", Buffer.alloc(0))]);
}
`;

export function writeRunner(dir: string): { runner: string; release: () => void } {
  const goFile = path.join(dir, "go");
  const runner = writeExecutable(
    dir,
    "draw.cjs",
    `${PNG_SOURCE}
const fs = require("node:fs");
const job = JSON.parse(fs.readFileSync(0, "utf8"));
console.log("SVC_PROGRESS 40 drawing");
console.log("drawing: " + job.task_spec.inputs.prompt);
const wait = setInterval(() => {
  if (!fs.existsSync(${JSON.stringify(goFile)})) return;
  clearInterval(wait);
  fs.writeFileSync(process.env.SVC_RESULT_FILE, JSON.stringify({ data: png(64, 48).toString("base64"), format: "png" }));
  console.log("done");
}, 100);
`,
  );
  return { runner, release: () => fs.writeFileSync(goFile, "go") };
}
