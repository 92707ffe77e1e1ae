// #/events/{id}: one event with its payload, and per destination its attempts as a timeline with
// a Retry button. After a retry the attempts are polled for a few seconds to show the new one.

import * as api from './api.js';
import {
  h, replace, alertBox, loading, emptyState, button, whileBusy, badge, timeCell, link, sleep,
  formatTime,
} from './ui.js';

// How long to look for the attempt a retry makes, and how often.
const RETRY_POLL_MS = 15000;
const RETRY_POLL_EVERY_MS = 700;
// When an event has no attempt yet, it may still be in the queue: look again a few times.
const FIRST_ATTEMPT_POLLS = 6;

export function render(root, { signal, params }) {
  const id = params.id;
  const head = h('div', { class: 'screen-head' },
    link('#/events', '← Events', { class: 'back' }), h('h1', { class: 'mono' }, id));
  const summary = h('section', { class: 'card', testid: 'event' }, loading('Loading the event…'));
  const timeline = h('section', { class: 'card', testid: 'attempts' }, loading('Loading attempts…'));
  root.append(head, summary, timeline);

  let destinations = new Map();

  api.getEvent(id, { signal }).then((event) => {
    replace(summary,
      h('dl', { class: 'facts' },
        h('dt', {}, 'Topic'), h('dd', {}, h('span', { class: 'chip', testid: 'event-topic' }, event.topic)),
        h('dt', {}, 'Time'), h('dd', {}, timeCell(event.time)),
        h('dt', {}, 'Id'), h('dd', { class: 'mono', testid: 'event-id' }, event.id)),
      h('h2', {}, 'Payload'),
      h('pre', { class: 'payload', testid: 'event-payload' }, JSON.stringify(event.data, null, 2)));
  }, (error) => {
    if (error.name !== 'AbortError') replace(summary, alertBox(error, 'event-error'));
  });

  // Destination URLs label the timelines; without them the ids still do.
  const named = api.listDestinations({ signal }).then((page) => {
    destinations = new Map(page.items.map((d) => [d.id, d]));
  }, () => {});

  async function loadAttempts() {
    const page = await api.listAttempts(id, { signal });
    await named;
    return page.items;
  }

  async function first() {
    try {
      let attempts = await loadAttempts();
      for (let i = 0; !attempts.length && i < FIRST_ATTEMPT_POLLS && !signal.aborted; i += 1) {
        replace(timeline, loading('No attempt yet; looking again…'));
        await sleep(1000, signal);
        attempts = await loadAttempts();
      }
      if (!signal.aborted) show(attempts);
    } catch (error) {
      if (error.name !== 'AbortError') replace(timeline, alertBox(error, 'attempts-error'));
    }
  }

  function show(attempts) {
    if (!attempts.length) {
      replace(timeline, h('h2', {}, 'Deliveries'),
        emptyState('attempts-empty', 'No attempts yet',
          'No destination matched this event, or its delivery is still queued.'),
        button('Refresh', first, { class: 'btn small' }));
      return;
    }
    const groups = new Map();
    for (const a of attempts) {
      if (!groups.has(a.destination_id)) groups.set(a.destination_id, []);
      groups.get(a.destination_id).push(a);
    }
    replace(timeline, h('h2', {}, 'Deliveries'),
      [...groups].map(([destinationId, list]) => group(destinationId, list)));
  }

  function group(destinationId, attempts) {
    // Oldest first, so the timeline reads down in time.
    attempts.sort((a, b) => (a.time < b.time ? -1 : a.time > b.time ? 1 : a.number - b.number));
    const latest = attempts[attempts.length - 1];
    const destination = destinations.get(destinationId);
    const message = h('div', { class: 'row-message', 'aria-live': 'polite', testid: 'retry-status' });
    const retryButton = button('Retry', (e) => retry(e.currentTarget, destinationId, attempts.length, message),
      { class: 'btn small primary', testid: 'retry' });
    return h('div', { class: 'destination-group', testid: 'destination-attempts', 'data-destination-id': destinationId },
      h('div', { class: 'group-head' },
        h('div', {},
          h('h3', { class: 'mono' }, destination?.config?.url ?? destinationId),
          h('span', { class: 'muted small' },
            `${destination ? destination.type : 'destination'} ${destinationId} · ${attempts.length} attempt${attempts.length === 1 ? '' : 's'}, latest `,
            LATEST[latest.status] ?? latest.status)),
        h('div', { class: 'actions' }, retryButton)),
      message,
      h('ol', { class: 'timeline' }, attempts.map(attempt)));
  }

  async function retry(btn, destinationId, before, message) {
    replace(message);
    await whileBusy(btn, async () => {
      try {
        await api.retry(id, destinationId, { signal });
        replace(message, loading('Retry queued: waiting for its attempt…'));
        const deadline = Date.now() + RETRY_POLL_MS;
        while (Date.now() < deadline && !signal.aborted) {
          await sleep(RETRY_POLL_EVERY_MS, signal);
          const attempts = await loadAttempts();
          if (attempts.filter((a) => a.destination_id === destinationId).length > before) {
            show(attempts);
            return;
          }
        }
        replace(message, h('p', { class: 'muted' },
          'The retry is queued, and its attempt has not shown yet. Reload to look again.'));
      } catch (error) {
        if (error.name !== 'AbortError') replace(message, alertBox(error, 'retry-error'));
      }
    });
  }

  first();
}

/** How a destination's latest attempt reads in its group's heading. */
const LATEST = { success: 'delivered', failed: 'failed', filtered: 'filtered by its transformation' };

/** The look of each attempt status: a success, a failure, or nothing sent (filtered). */
const STATUS_KIND = { success: 'ok', failed: 'bad', filtered: 'off' };

function attempt(a) {
  const kind = STATUS_KIND[a.status] ?? 'bad';
  return h('li', { class: ['attempt', kind], testid: 'attempt', 'data-status': a.status, 'data-trigger': a.trigger },
    h('div', { class: 'attempt-head' },
      badge(a.status, kind, 'attempt-status'),
      a.response_code != null ? h('span', { class: 'code', testid: 'attempt-code' }, `HTTP ${a.response_code}`) : null,
      h('span', { class: 'muted', testid: 'attempt-duration' }, `${a.duration_ms ?? '?'} ms`),
      badge(a.trigger, a.trigger === 'manual' ? 'info' : 'off', 'attempt-trigger'),
      h('span', { class: 'muted' }, `#${a.number}`),
      h('time', { class: 'muted', datetime: a.time, title: a.time }, formatTime(a.time))),
    a.error ? h('p', { class: 'attempt-error', testid: 'attempt-error' }, a.error) : null,
    a.response_body ? h('pre', { class: 'excerpt', testid: 'attempt-body' }, a.response_body) : null);
}
