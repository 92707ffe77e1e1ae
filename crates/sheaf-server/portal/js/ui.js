// Small DOM helpers. Everything is built with createElement and textContent, never innerHTML, so
// text from the API (payloads, response bodies, ids) is never parsed as markup; and handlers are
// attached with addEventListener, since the Content-Security-Policy forbids inline ones.

const SVG_NS = 'http://www.w3.org/2000/svg';

function assign(el, props, children) {
  for (const [key, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith('on') && typeof value === 'function') {
      el.addEventListener(key.slice(2), value);
    } else if (key === 'text') {
      el.textContent = String(value);
    } else if (key === 'class') {
      el.setAttribute('class', Array.isArray(value) ? value.filter(Boolean).join(' ') : value);
    } else if (key === 'testid') {
      el.setAttribute('data-testid', value);
    } else if (key === 'value') {
      el.value = value;
    } else {
      el.setAttribute(key, value === true ? '' : String(value));
    }
  }
  append(el, children);
  return el;
}

/** An HTML element: `h('p', {class: 'note', testid: 'x'}, 'text', child)`. */
export function h(tag, props, ...children) {
  return assign(document.createElement(tag), props, children);
}

/** An SVG element, for the chart. */
export function svg(tag, props, ...children) {
  return assign(document.createElementNS(SVG_NS, tag), props, children);
}

/** Appends children: nodes as they are, anything else as text; null and false are skipped. */
export function append(el, ...children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

/** Replaces an element's children. */
export function replace(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

/** The words of an error, for the page. */
export function describe(error) {
  if (error && error.message) return error.message;
  return String(error);
}

/** An error shown in words; `role="alert"` so assistive technology (and the tests) find it. */
export function alertBox(error, testid = 'error') {
  return h('div', { class: 'alert', role: 'alert', testid }, describe(error));
}

/** A note that something is on its way. */
export function loading(text = 'Loading…') {
  return h('p', { class: 'loading', role: 'status', testid: 'loading' },
    h('span', { class: 'spinner', 'aria-hidden': 'true' }), text);
}

/** What a screen shows when there is nothing to list. */
export function emptyState(testid, title, ...hint) {
  return h('div', { class: 'empty', testid }, h('p', { class: 'empty-title' }, title),
    hint.length ? h('p', { class: 'muted' }, ...hint) : null);
}

/** A button; `onclick` gets the event. */
export function button(label, onclick, props = {}) {
  return h('button', { type: 'button', class: 'btn', ...props, onclick }, label);
}

/**
 * Runs `work` with `btn` disabled, so a slow call cannot be sent twice by a second click.
 * Returns what `work` returned.
 */
export async function whileBusy(btn, work) {
  btn.disabled = true;
  btn.setAttribute('aria-busy', 'true');
  try {
    return await work();
  } finally {
    btn.disabled = false;
    btn.removeAttribute('aria-busy');
  }
}

/** A labelled form field around `input`. */
export function field(label, input, hint) {
  return h('label', { class: 'field' }, h('span', { class: 'field-label' }, label), input,
    hint ? h('span', { class: 'field-hint' }, hint) : null);
}

/** A status badge: kind is ok, bad, off or info. */
export function badge(text, kind, testid) {
  return h('span', { class: ['badge', kind], testid }, text);
}

const pad = (n) => String(n).padStart(2, '0');

/** A time in the reader's zone, as `2026-12-02 09:14:03`. */
export function formatTime(iso) {
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return String(iso ?? '');
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} `
    + `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

/** A span of time in words: `45 s`, `14 min`, `2 h 5 min`, `3 days`. */
export function span(ms) {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return `${s} s`;
  const min = Math.floor(s / 60);
  if (min < 60) return `${min} min`;
  const hours = Math.floor(min / 60);
  if (hours < 48) return min % 60 ? `${hours} h ${min % 60} min` : `${hours} h`;
  return `${Math.floor(hours / 24)} days`;
}

/** How long ago a time was: `just now`, `5 min ago`. */
export function ago(iso) {
  const ms = Date.now() - new Date(iso).getTime();
  if (Number.isNaN(ms)) return '';
  return ms < 5000 ? 'just now' : `${span(ms)} ago`;
}

/** A time with its age as a tooltip-free second line. */
export function timeCell(iso) {
  return h('time', { datetime: iso, title: iso }, formatTime(iso),
    h('span', { class: 'muted small block' }, ago(iso)));
}

/** Resolves after `ms`, or at once when `signal` aborts. */
export function sleep(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener('abort', () => { clearTimeout(timer); resolve(); }, { once: true });
  });
}

/** A route's link. */
export function link(hash, text, props = {}) {
  return h('a', { href: hash, ...props }, text);
}

/** The hash of one event's screen. */
export function eventHash(id) {
  return `#/events/${encodeURIComponent(id)}`;
}
