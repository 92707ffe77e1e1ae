// The portal's entry: the session (from a portal link's fragment, or an admin's sign-in), the
// header with its live expiry, and the hash router that renders one screen at a time.
//
// A portal link is `/portal/#tenant=…&token=sheaf_tt1_…&expires=…`. The fragment never reaches a
// server (nor a Referer); the page reads it once, keeps the token in memory (api.js) and at once
// replaces the URL with one without it, so it is not left in the address bar or the history.

import * as api from './api.js';
import * as destinations from './destinations.js';
import * as events from './events.js';
import * as event from './event.js';
import * as deadLetters from './dead_letters.js';
import { h, replace, alertBox, button, field, span, formatTime } from './ui.js';

const main = document.getElementById('main');
const sessionSlot = document.getElementById('session');
const nav = document.getElementById('nav');
const busyIndicator = document.getElementById('busy');

const SCREENS = {
  destinations: { module: destinations, title: 'Destinations' },
  events: { module: events, title: 'Events' },
  event: { module: event, title: 'Event' },
  'dead-letters': { module: deadLetters, title: 'Dead letters' },
};

// A problem with the link itself, shown instead of the sign-in form.
let linkProblem = null;
// Aborts the current screen's calls and polls when the route changes or the token expires.
let screenController = null;
let expiryTimer = null;
let busyTimer = null;

/** The claims of a tenant token (`sheaf_tt1_<base64url JSON>.<sig>`), or null. */
export function tokenClaims(token) {
  const match = /^sheaf_tt1_([A-Za-z0-9_-]+)\./.exec(token || '');
  if (!match) return null;
  try {
    const base64 = match[1].replace(/-/g, '+').replace(/_/g, '/');
    const json = atob(base64 + '='.repeat((4 - (base64.length % 4)) % 4));
    return JSON.parse(json);
  } catch {
    return null;
  }
}

/** Takes the session out of a portal link's fragment; true if the fragment was one. */
function takeLink() {
  const raw = location.hash.replace(/^#/, '');
  if (!/(^|&)(tenant|token)=/.test(raw)) return false;
  const fields = new URLSearchParams(raw);
  // First of all, the token leaves the address bar and the history entry.
  history.replaceState(null, '', '#/destinations');
  const tenant = fields.get('tenant');
  const token = fields.get('token');
  if (!tenant || !token) {
    api.setSession(null);
    linkProblem = 'This portal link is incomplete: it needs a tenant and a token. Ask for a new one.';
    return true;
  }
  const claims = tokenClaims(token);
  let expiresAt = Date.parse(fields.get('expires') || '');
  if (Number.isNaN(expiresAt) && claims && typeof claims.exp === 'number') expiresAt = claims.exp * 1000;
  linkProblem = null;
  api.setSession({ tenant, token, expiresAt: Number.isNaN(expiresAt) ? null : expiresAt, admin: false });
  return true;
}

function parseRoute() {
  const [path] = location.hash.replace(/^#\/?/, '').split('?');
  const parts = path.split('/').filter(Boolean);
  if (parts[0] === 'events' && parts.length > 1) {
    let id = parts.slice(1).join('/');
    try {
      id = decodeURIComponent(id);
    } catch {
      // Keep it as written: the API answers 404 in words.
    }
    return { name: 'event', params: { id } };
  }
  return { name: SCREENS[parts[0]] ? parts[0] : 'destinations', params: {} };
}

function renderHeader(routeName) {
  const session = api.getSession();
  nav.hidden = !session;
  for (const a of nav.querySelectorAll('a')) {
    const current = a.dataset.route === routeName || (routeName === 'event' && a.dataset.route === 'events');
    if (current) a.setAttribute('aria-current', 'page'); else a.removeAttribute('aria-current');
  }
  if (!session) {
    sessionSlot.replaceChildren();
    return;
  }
  const expiry = h('span', { class: 'expiry', testid: 'expiry' });
  replace(sessionSlot,
    h('span', { class: 'tenant' }, h('span', { class: 'muted' }, 'Tenant '),
      h('strong', { testid: 'tenant' }, session.tenant)),
    session.admin ? h('span', { class: 'badge info', testid: 'admin-badge' }, 'admin key') : expiry,
    button(session.admin ? 'Sign out' : 'Forget link', signOut, { class: 'btn small ghost', testid: 'sign-out' }));
  if (!session.admin) updateExpiry(expiry);
}

function updateExpiry(el) {
  const session = api.getSession();
  if (!session || session.admin || !el) return;
  if (!session.expiresAt) {
    el.textContent = 'no expiry known';
    return;
  }
  const left = session.expiresAt - Date.now();
  el.title = `The link's token expires at ${formatTime(new Date(session.expiresAt).toISOString())}`;
  if (left > 0) {
    el.textContent = `expires in ${span(left)}`;
    el.classList.toggle('soon', left < 5 * 60e3);
  } else {
    el.textContent = `expired ${span(-left)} ago`;
    el.classList.add('expired');
  }
}

function tick() {
  updateExpiry(sessionSlot.querySelector('[data-testid=expiry]'));
  const session = api.getSession();
  if (session && !session.admin && api.expired() && !document.querySelector('[data-testid=expired]')) {
    // Stop every call and poll of the screen, and say so.
    screenController?.abort();
    replace(main, expiredNotice());
  }
}

function expiredNotice() {
  const session = api.getSession();
  return h('section', { class: 'card' },
    h('div', { class: 'alert', role: 'alert', testid: 'expired' },
      `This portal link expired at ${formatTime(new Date(session.expiresAt).toISOString())}. `
      + 'Ask for a new link to go on.'));
}

function signOut() {
  api.setSession(null);
  linkProblem = null;
  history.replaceState(null, '', '#/');
  route();
}

function signInForm() {
  const key = h('input', {
    type: 'password', required: true, autocomplete: 'off', spellcheck: 'false', testid: 'signin-key',
  });
  const tenant = h('input', {
    type: 'text', required: true, autocomplete: 'off', spellcheck: 'false', pattern: '[A-Za-z0-9._\\-]{1,64}',
    placeholder: 'acme', testid: 'signin-tenant',
  });
  const submit = h('button', { type: 'submit', class: 'btn primary', testid: 'signin-submit' }, 'Open the portal');
  const message = h('div', { 'aria-live': 'polite' });
  const form = h('form', { class: 'card signin', testid: 'signin-form' },
    h('h1', {}, 'Sheaf portal'),
    h('p', { class: 'muted' }, 'Open a portal link to see one tenant, or sign in with the admin key (SHEAF_API_KEY) and pick a tenant. The key stays in this page’s memory only.'),
    linkProblem ? alertBox(linkProblem, 'link-error') : null,
    field('Admin key', key), field('Tenant id', tenant), h('div', { class: 'actions' }, submit), message);
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    message.replaceChildren();
    api.setSession({ tenant: tenant.value.trim(), token: key.value, expiresAt: null, admin: true });
    submit.disabled = true;
    try {
      await api.getTenant();
      linkProblem = null;
      key.value = '';
      history.replaceState(null, '', '#/destinations');
      route();
    } catch (error) {
      api.setSession(null);
      replace(message, alertBox(error, 'signin-error'));
    } finally {
      submit.disabled = false;
    }
  });
  return form;
}

function route() {
  screenController?.abort();
  screenController = new AbortController();
  const session = api.getSession();
  const current = parseRoute();
  renderHeader(session ? current.name : null);
  if (!session) {
    document.title = 'Sign in · Sheaf portal';
    replace(main, signInForm());
    main.querySelector('input')?.focus();
    return;
  }
  if (api.expired()) {
    replace(main, expiredNotice());
    return;
  }
  const screen = SCREENS[current.name];
  document.title = `${screen.title} · ${session.tenant} · Sheaf portal`;
  const root = h('div', { class: 'screen', testid: `screen-${current.name}` });
  replace(main, root);
  try {
    screen.module.render(root, { signal: screenController.signal, params: current.params });
  } catch (error) {
    replace(main, alertBox(error));
  }
}

window.addEventListener('hashchange', () => {
  takeLink();
  route();
});

api.onBusy((busy) => {
  // Shown only for calls slower than a moment, so fast screens do not flicker.
  clearTimeout(busyTimer);
  if (busy) busyTimer = setTimeout(() => { busyIndicator.hidden = false; }, 250);
  else busyIndicator.hidden = true;
});

takeLink();
route();
clearInterval(expiryTimer);
expiryTimer = setInterval(tick, 1000);
