// #/dead-letters: deliveries Sheaf gave up on, each with Retry (back in the queue, in its
// place if it blocks its ordering key) and Discard (gone; a key it blocked goes on).

import * as api from './api.js';
import {
  h, replace, alertBox, loading, emptyState, button, whileBusy, timeCell, link, eventHash, badge,
} from './ui.js';

export function render(root, { signal }) {
  const results = h('section', { class: 'card', testid: 'dead-letters' });
  const cursors = [null];
  root.append(h('div', { class: 'screen-head' }, h('h1', {}, 'Dead letters'),
    h('p', { class: 'muted' }, 'Deliveries that ran out of attempts, or whose destination was disabled. Retry puts one back in the queue now; Discard drops it. One marked "blocks its key" holds back the later events of its ordering key until it is retried or discarded.')),
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
    const act = (work, done) => (e) => whileBusy(e.currentTarget, async () => {
      message.replaceChildren();
      try {
        await work();
        actions.replaceChildren();
        replace(message, ...done());
      } catch (error) {
        if (error.name !== 'AbortError') replace(message, alertBox(error, 'dead-letter-error'));
      }
    });
    const retry = button('Retry', act(() => api.retryDeadLetter(d.job_id, { signal }), () => [
      h('span', { class: 'badge info', testid: 'retry-queued' }, 'back in the queue'),
      ' ', link(eventHash(d.event_id), 'follow it')]),
    { class: 'btn small primary', testid: 'dead-letter-retry' });
    const discardForGood = button('Discard for good',
      act(() => api.discardDeadLetter(d.job_id, { signal }), () => [
        h('span', { class: 'badge off', testid: 'discarded' }, 'discarded')]),
      { class: 'btn small danger', testid: 'dead-letter-discard-confirm' });
    const discard = button('Discard', () => actions.replaceChildren(discardForGood,
      button('Keep', () => actions.replaceChildren(retry, discard), { class: 'btn small' })),
    { class: 'btn small', testid: 'dead-letter-discard' });
    const actions = h('span', {}, retry, discard);
    return h('tr', { testid: 'dead-letter-row', 'data-event-id': d.event_id, 'data-job-id': d.job_id },
      h('td', {}, timeCell(d.dead_lettered_at)),
      h('td', { class: 'mono' }, link(eventHash(d.event_id), d.event_id)),
      h('td', { class: 'mono small' }, d.destination_id),
      h('td', { class: 'num' }, String(d.attempts)),
      h('td', {}, d.reason, d.blocks_key ? [' ', badge('blocks its key', 'bad', 'blocks-key')] : null),
      h('td', { class: 'row-actions' }, actions, message));
  }

  load();
}
