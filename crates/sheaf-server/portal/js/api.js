// The one place that talks to the server. Every call goes to the public API under /api/v1 with
// the session's credential (a tenant token or the admin key) as a bearer token; an error answer
// `{"error": {"code", "message"}}` becomes an ApiError whose message reads "403 forbidden: …".
//
// The credential lives in this module's memory only: never in storage or a cookie, so closing
// the tab forgets it.

// Relative to /portal/, so the portal also works behind a proxy that mounts Sheaf under a prefix.
const BASE = '../api/v1';

/** An answer that was not a success, or a call that could not be made. */
export class ApiError extends Error {
  constructor(status, code, message) {
    super(status ? `${status} ${code}: ${message}` : message);
    this.name = 'ApiError';
    this.status = status;
    this.code = code;
  }
}

let session = null;
let inFlight = 0;
const busyListeners = new Set();

/**
 * Signs in: `{tenant, token, expiresAt (ms since the epoch, or null), admin}`, or null to
 * forget it.
 */
export function setSession(next) {
  session = next;
}

export function getSession() {
  return session;
}

/** Whether the session's token has expired (an admin key does not). */
export function expired() {
  return Boolean(session && session.expiresAt && Date.now() >= session.expiresAt);
}

/** `listener(busy)` hears when calls start and all end, for the loading indicator. */
export function onBusy(listener) {
  busyListeners.add(listener);
}

function setBusy(delta) {
  const was = inFlight > 0;
  inFlight += delta;
  if (was !== inFlight > 0) for (const listener of busyListeners) listener(inFlight > 0);
}

/** Sends one call; resolves to the parsed JSON answer (null for 204). */
export async function call(method, path, { query, body, signal } = {}) {
  if (!session) throw new ApiError(0, 'signed_out', 'not signed in');
  if (expired()) {
    throw new ApiError(0, 'expired', 'this portal link has expired: ask for a new one');
  }
  let url = BASE + path;
  if (query) {
    const params = new URLSearchParams();
    for (const [key, value] of Object.entries(query)) {
      if (value !== undefined && value !== null && value !== '') params.set(key, String(value));
    }
    const text = params.toString();
    if (text) url += `?${text}`;
  }
  const headers = { Authorization: `Bearer ${session.token}`, Accept: 'application/json' };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  setBusy(1);
  try {
    let response;
    try {
      response = await fetch(url, {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        signal,
        cache: 'no-store',
        credentials: 'omit',
        referrerPolicy: 'no-referrer',
      });
    } catch (error) {
      if (error.name === 'AbortError') throw error;
      throw new ApiError(0, 'network', `the server could not be reached (${error.message})`);
    }
    const text = await response.text();
    let json = null;
    try {
      json = text ? JSON.parse(text) : null;
    } catch {
      json = null;
    }
    if (!response.ok) {
      const error = json && typeof json.error === 'object' ? json.error : {};
      const code = typeof error.code === 'string' ? error.code
        : (response.statusText || 'error').toLowerCase().replace(/\s+/g, '_');
      const message = typeof error.message === 'string' ? error.message
        : (text.trim().slice(0, 200) || 'no details');
      throw new ApiError(response.status, code, message);
    }
    return json;
  } finally {
    setBusy(-1);
  }
}

/** A path under the session's tenant, each part encoded. */
function tenant(...parts) {
  return `/tenants/${encodeURIComponent(session.tenant)}`
    + parts.map((part) => `/${encodeURIComponent(part)}`).join('');
}

export const getTenant = (opts) => call('GET', tenant(), opts);

export const listDestinations = (opts) => call('GET', tenant('destinations'), opts);
export const createDestination = (body, opts) =>
  call('POST', tenant('destinations'), { ...opts, body });
export const updateDestination = (id, body, opts) =>
  call('PATCH', tenant('destinations', id), { ...opts, body });
export const setDestinationEnabled = (id, enabled, opts) =>
  call('PUT', tenant('destinations', id, enabled ? 'enable' : 'disable'), opts);
export const rotateSecret = (id, opts) =>
  call('POST', tenant('destinations', id, 'rotate-secret'), opts);
export const tryTransformation = (body, opts) =>
  call('POST', tenant('transformations', 'try'), { ...opts, body });
export const deleteDestination = (id, opts) => call('DELETE', tenant('destinations', id), opts);

/** `filters`: topic, since, until (RFC 3339), next, limit. */
export const listEvents = (filters, opts) =>
  call('GET', tenant('events'), { ...opts, query: filters });
export const getEvent = (id, opts) => call('GET', tenant('events', id), opts);
export const listAttempts = (eventId, opts) =>
  call('GET', tenant('attempts'), { ...opts, query: { event_id: eventId, limit: 100 } });
export const listDeadLetters = (next, opts) =>
  call('GET', tenant('dead-letters'), { ...opts, query: { limit: 50, next } });
export const retryDeadLetter = (jobId, opts) =>
  call('POST', tenant('dead-letters', jobId, 'retry'), opts);
export const discardDeadLetter = (jobId, opts) =>
  call('DELETE', tenant('dead-letters', jobId), opts);
export const retry = (eventId, destinationId, opts) =>
  call('POST', tenant('retry'), {
    ...opts, body: { event_id: eventId, destination_id: destinationId },
  });
export const attemptStats = (minutes, opts) =>
  call('GET', tenant('stats', 'attempts'), { ...opts, query: { minutes } });
