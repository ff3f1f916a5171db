// Follows TensorBoard's theme. TensorBoard 2.21 toggles the class
// `dark-mode` on its own document.body (its dark-mode setting, whose default
// comes from prefers-color-scheme: dark); the plugin's iframe is same-origin,
// so the tab watches that class. Opened outside TensorBoard (or if the host
// cannot be read), it follows prefers-color-scheme itself.

function hostBody(win) {
  try {
    const parent = win.parent;
    if (parent && parent !== win && parent.document && parent.document.body) return parent.document.body;
  } catch (e) {
    // A cross-origin host: fall back to the media query.
  }
  return null;
}

/**
 * Keeps `dark` on doc.body in step with the host, and calls onChange(dark)
 * whenever it flips (canvases repaint their chrome).
 * @param {Document} doc The tab's document.
 * @param {(dark: boolean) => void} onChange
 * @returns {() => boolean} Whether the tab is dark now.
 */
export function followTheme(doc, onChange) {
  const win = doc.defaultView;
  const host = hostBody(win);
  const media = win.matchMedia ? win.matchMedia('(prefers-color-scheme: dark)') : null;
  const isDark = () => (host ? host.classList.contains('dark-mode') : !!(media && media.matches));
  let dark = null;
  const apply = () => {
    const now = isDark();
    if (now === dark) return;
    dark = now;
    doc.body.classList.toggle('dark', dark);
    doc.documentElement.classList.toggle('dark', dark); // the page below the body too
    doc.documentElement.style.colorScheme = dark ? 'dark' : 'light';
    onChange(dark);
  };
  if (host) new win.MutationObserver(apply).observe(host, {attributes: true, attributeFilter: ['class']});
  else if (media && media.addEventListener) media.addEventListener('change', apply);
  apply();
  return () => !!dark;
}
