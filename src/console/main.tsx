// Entry of the console: the layout, the signed-in role's pages, sign-in.
import "uplot/dist/uPlot.min.css";
import "./style.css";
import { render } from "preact";
import { useEffect, useState } from "preact/hooks";
import { onSessionChange, session, signOut, type Role } from "./session.js";
import { href, useRoute } from "./router.js";
import { useConnectionLost } from "./ui.js";
import { SignIn } from "./pages/sign-in.js";
import { RenterPages, RENTER_NAV } from "./pages/renter.js";
import { ProviderPages, PROVIDER_NAV } from "./pages/provider.js";
import { OperatorPages, OPERATOR_NAV } from "./pages/operator.js";

const NAV: Record<Role, [string, string][]> = { renter: RENTER_NAV, provider: PROVIDER_NAV, admin: OPERATOR_NAV };
const ROLE_NAME: Record<Role, string> = { renter: "Renter", provider: "Provider", admin: "Operator" };

function useSession() {
  const [s, set] = useState(session());
  useEffect(() => onSessionChange(() => set(session())), []);
  return s;
}

function App() {
  const s = useSession();
  const route = useRoute();
  const lost = useConnectionLost();
  const [menuOpen, setMenuOpen] = useState(false);
  useEffect(() => setMenuOpen(false), [route.join("/")]);
  const section = route[1] ?? "";
  return (
    <>
      <a class="skip" href="#main" onClick={(e) => { e.preventDefault(); document.getElementById("main")?.focus(); }}>
        Skip to content
      </a>
      <header class="top">
        <a class="brand" href={s ? href(s.role) : "#/"}>
          svc <span>GPU marketplace</span>
        </a>
        {s ? (
          <>
            <button class="menu-toggle" aria-expanded={menuOpen} aria-controls="nav" onClick={() => setMenuOpen(!menuOpen)}>
              Menu
            </button>
            <nav id="nav" class={menuOpen ? "open" : ""} aria-label="Main">
              {NAV[s.role].map(([path, name]) => (
                <a href={href(s.role, ...(path ? [path] : []))} aria-current={section === path ? "page" : undefined}>
                  {name}
                </a>
              ))}
            </nav>
            <div class="who">
              <span>
                {ROLE_NAME[s.role]}: {s.label}
              </span>
              <button
                class="link"
                onClick={() => {
                  signOut();
                  location.hash = "#/";
                }}
              >
                Sign out
              </button>
            </div>
          </>
        ) : null}
      </header>
      {lost ? (
        <div class="banner" role="status">
          Lost connection to the service. Retrying…
        </div>
      ) : null}
      <main id="main" tabIndex={-1}>
        {!s ? (
          <SignIn />
        ) : s.role === "renter" ? (
          <RenterPages route={route.slice(1)} />
        ) : s.role === "provider" ? (
          <ProviderPages route={route.slice(1)} />
        ) : (
          <OperatorPages route={route.slice(1)} />
        )}
      </main>
    </>
  );
}

/**
 * On narrow screens tables stack each row as a card (style.css); every cell
 * is labelled with its column's heading for that, whichever page drew it.
 */
function labelCells(root: ParentNode) {
  for (const table of root.querySelectorAll("table")) {
    const heads = [...table.querySelectorAll("thead th")].map((th) => th.textContent ?? "");
    for (const tr of table.querySelectorAll("tbody tr")) {
      [...tr.children].forEach((td, i) => {
        if (heads[i] && (td as HTMLElement).dataset.label !== heads[i]) (td as HTMLElement).dataset.label = heads[i];
      });
    }
  }
}

const app = document.getElementById("app")!;
new MutationObserver(() => labelCells(app)).observe(app, { childList: true, subtree: true });
render(<App />, app);
