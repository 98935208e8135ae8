// What the server says of this deployment (a meta tag; CSP allows no inline script).
export interface Settings {
  production: boolean;
  sandboxTopup: boolean;
  cardCheckout: boolean;
  emailCodes: boolean;
}

export const settings: Settings = (() => {
  const raw = document.querySelector('meta[name="svc-settings"]')?.getAttribute("content");
  try {
    return { production: false, sandboxTopup: false, cardCheckout: false, emailCodes: false, ...(raw ? JSON.parse(raw) : {}) };
  } catch {
    return { production: false, sandboxTopup: false, cardCheckout: false, emailCodes: false };
  }
})();
