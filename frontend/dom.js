// DOM helpers shared by the view modules. Names are user data (a layer may
// be called `<img src=x onerror=...>`): text goes in through textContent only.

/**
 * Creates an element.
 * @param {Document} doc
 * @param {string} tag
 * @param {{id?, className?, text?, title?, attrs?: object, dataset?: object}} [props]
 * @param {...Node} children
 */
export function el(doc, tag, props = {}, ...children) {
  const node = doc.createElement(tag);
  if (props.id) node.id = props.id;
  if (props.className) node.className = props.className;
  if (props.text != null) node.textContent = props.text;
  if (props.title != null) node.title = props.title;
  if (props.attrs) for (const [k, v] of Object.entries(props.attrs)) node.setAttribute(k, v);
  if (props.dataset) Object.assign(node.dataset, props.dataset);
  for (const child of children) if (child) node.append(child);
  return node;
}

export const FONT_FAMILY = 'system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif';
export const LABEL_FONT = `11px ${FONT_FAMILY}`;

/** A width measurer for a font (canvas measureText), cached. */
export function makeMeasure(doc, font = LABEL_FONT) {
  const ctx = doc.createElement('canvas').getContext('2d');
  ctx.font = font;
  const cache = new Map();
  return (s) => {
    let w = cache.get(s);
    if (w === undefined) {
      w = ctx.measureText(s).width;
      cache.set(s, w);
    }
    return w;
  };
}

/** Sizes canvases to pw x ph device pixels shown at cssW x cssH; returns the first one's cleared context. */
export function sizeCanvases(canvases, pw, ph, cssW, cssH) {
  for (const c of canvases) {
    if (c.width !== pw) c.width = pw;
    if (c.height !== ph) c.height = ph;
    c.style.width = `${cssW}px`;
    c.style.height = `${cssH}px`;
  }
  const ctx = canvases[0].getContext('2d');
  ctx.setTransform(1, 0, 0, 1, 0, 0);
  ctx.clearRect(0, 0, pw, ph);
  return ctx;
}
