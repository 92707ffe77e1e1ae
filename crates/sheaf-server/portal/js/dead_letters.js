// #/dead-letters: deliveries Sheaf gave up on, each with a Retry button.

import * as api from './api.js';
import {
  h, replace, alertBox, loading, emptyState, button, whileBusy, timeCell, link, eventHash,
} from './ui.js';

export function render(root, { signal }) {
  const results = h('section', { class: 'card', testid: 'dead-letters' });
  const cursors = [null];
  root.append(h('div', { class: 'screen-head' }, h('h1', {}, 'Dead letters'),
    h('p', { class: 'muted' }, 'Deliveries that ran out of attempts, or whose destination was disabled. A retry delivers again now.')),
  results);

  async function load() {
    replace(results, loading('Loading dead letters…'));
    try {
      const page = await api.listDeadLetters(cursors[cursors.length - 1], { signal });
      replace(results, listing(page));
    } catch (error) {
      if (error.name !== 'AbortError') replace(results, alertBox(error, 'dead-letters-error'));
    }
  }

  function listing(page) {
    if (!page.items.length && cursors.length === 1) {
      return emptyState('dead-letters-empty', 'No dead letters',
        'Every delivery so far succeeded or is still being retried.');
    }
    return h('div', {},
      h('table', { class: 'table' },
        h('thead', {}, h('tr', {}, ['Dead-lettered', 'Event', 'Destination', 'Attempts', 'Reason', '']
          .map((t) => h('th', { scope: 'col' }, t)))),
        h('tbody', {}, page.items.map(row))),
      h('div', { class: 'pager' },
        cursors.length > 1 ? button('Newest', () => { cursors.length = 1; load(); }, { class: 'btn small' }) : null,
        page.next ? button('Next page', () => { cursors.push(page.next); load(); },
          { class: 'btn small', testid: 'dead-letters-next' }) : null));
  }

  function row(d) {
    const message = h('div', { class: 'row-message', 'aria-live': 'polite' });
    const retry = button('Retry', (e) => whileBusy(e.currentTarget, async () => {
      message.replaceChildren();
      try {
        await api.retry(d.event_id, d.destination_id, { signal });
        replace(message, h('span', { class: 'badge info', testid: 'retry-queued' }, 'retry queued'),
          ' ', link(eventHash(d.event_id), 'follow it'));
      } catch (error) {
        if (error.name !== 'AbortError') replace(message, alertBox(error, 'retry-error'));
      }
    }), { class: 'btn small primary', testid: 'dead-letter-retry' });
    return h('tr', { testid: 'dead-letter-row', 'data-event-id': d.event_id },
      h('td', {}, timeCell(d.dead_lettered_at)),
      h('td', { class: 'mono' }, link(eventHash(d.event_id), d.event_id)),
      h('td', { class: 'mono small' }, d.destination_id),
      h('td', { class: 'num' }, String(d.attempts)),
      h('td', {}, d.reason),
      h('td', { class: 'row-actions' }, retry, message));
  }

  load();
}
