// #/events: the tenant's events, newest first, filtered by topic and time, with cursor paging.

import * as api from './api.js';
import { chartCard } from './chart.js';
import {
  h, replace, alertBox, loading, emptyState, button, field, timeCell, link, eventHash,
} from './ui.js';

const RANGES = [
  ['1h', 'Last hour', 3600e3],
  ['24h', 'Last 24 hours', 86400e3],
  ['7d', 'Last 7 days', 7 * 86400e3],
  ['all', 'All time', null],
];

// The filters and the page survive leaving the screen and coming back (an event and back).
const state = { topic: '', range: 'all', cursors: [null] };

/** RFC 3339 without milliseconds, `ms` before now. */
function before(ms) {
  return new Date(Date.now() - ms).toISOString().replace(/\.\d{3}Z$/, 'Z');
}

export function render(root, { signal }) {
  const results = h('section', { class: 'card', testid: 'events' });
  const topic = h('input', {
    type: 'text', value: state.topic, placeholder: 'order.created', testid: 'filter-topic',
  });
  const range = h('select', { testid: 'filter-range' }, RANGES.map(([value, label]) =>
    h('option', { value, selected: value === state.range }, label)));
  const form = h('form', { class: 'card filters', testid: 'filters' },
    h('div', { class: 'row' }, field('Topic', topic, 'An exact topic; empty for all'),
      field('Time', range),
      h('div', { class: 'field field-submit' },
        h('button', { type: 'submit', class: 'btn primary', testid: 'filter-apply' }, 'Apply'))));
  form.addEventListener('submit', (e) => {
    e.preventDefault();
    state.topic = topic.value.trim();
    state.range = range.value;
    state.cursors = [null];
    load();
  });
  range.addEventListener('change', () => form.requestSubmit());

  async function load() {
    replace(results, loading('Loading events…'));
    const span = RANGES.find(([value]) => value === state.range)?.[2];
    try {
      const page = await api.listEvents({
        limit: 20,
        topic: state.topic,
        since: span ? before(span) : undefined,
        next: state.cursors[state.cursors.length - 1],
      }, { signal });
      replace(results, listing(page));
    } catch (error) {
      if (error.name !== 'AbortError') replace(results, alertBox(error, 'events-error'));
    }
  }

  function listing(page) {
    const filtered = state.topic || state.range !== 'all';
    if (!page.items.length && state.cursors.length === 1) {
      return filtered
        ? emptyState('events-empty', 'No events match these filters',
          'Clear the topic or widen the time range.')
        : emptyState('events-empty', 'No events yet — publish one with POST /api/v1/publish',
          'Each published event shows here, newest first, with its deliveries.');
    }
    const pageNumber = state.cursors.length;
    return h('div', {},
      h('table', { class: 'table' },
        h('thead', {}, h('tr', {}, ['Time', 'Topic', 'Event id'].map((t) => h('th', { scope: 'col' }, t)))),
        h('tbody', {}, page.items.map((e) => h('tr', { testid: 'event-row', 'data-id': e.id },
          h('td', {}, timeCell(e.time)),
          h('td', {}, h('span', { class: 'chip' }, e.topic)),
          h('td', { class: 'mono' }, link(eventHash(e.id), e.id, { testid: 'event-link' })))))),
      h('div', { class: 'pager' },
        pageNumber > 1 ? button('Newest', () => { state.cursors = [null]; load(); },
          { class: 'btn small', testid: 'events-first' }) : null,
        pageNumber > 1 ? button('Previous page', () => { state.cursors.pop(); load(); },
          { class: 'btn small', testid: 'events-previous' }) : null,
        h('span', { class: 'muted small' }, `Page ${pageNumber}`),
        page.next ? button('Next page', () => { state.cursors.push(page.next); load(); },
          { class: 'btn small', testid: 'events-next' }) : null));
  }

  root.append(h('div', { class: 'screen-head' }, h('h1', {}, 'Events'),
    h('p', { class: 'muted' }, 'What was published for this tenant, newest first.')),
  chartCard(signal), form, results);
  load();
}
