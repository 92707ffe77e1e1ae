// Deliveries and failures over the last hour, one bar per minute, from the aggregate
// `GET …/stats/attempts?minutes=60` (the server counts; the browser never fetches every attempt).
// Drawn as inline SVG through createElementNS: the policy allows no inline styles, so colours
// come from classes in portal.css.

import * as api from './api.js';
import { h, svg, replace, alertBox, loading, formatTime } from './ui.js';

const WIDTH = 1000;
const HEIGHT = 140;
const TOP = 6;
const BOTTOM = 18;

/** A card that loads and draws the chart by itself. */
export function chartCard(signal) {
  const body = h('div', { class: 'chart-body' }, loading('Loading the last hour…'));
  const card = h('section', { class: 'card chart-card', testid: 'chart-card' },
    h('div', { class: 'card-head' }, h('h2', {}, 'Deliveries, last hour')), body);
  api.attemptStats(60, { signal }).then(
    (stats) => replace(body, drawChart(stats)),
    (error) => { if (error.name !== 'AbortError') replace(body, alertBox(error, 'chart-error')); },
  );
  return card;
}

/** The chart's SVG and legend for a stats answer. */
export function drawChart(stats) {
  const buckets = Array.isArray(stats.buckets) ? stats.buckets : [];
  let success = 0;
  let failed = 0;
  let peak = 0;
  for (const b of buckets) {
    success += b.success;
    failed += b.failed;
    peak = Math.max(peak, b.success + b.failed);
  }
  const summary = `Last hour: ${success} delivered, ${failed} failed`;
  const plot = HEIGHT - TOP - BOTTOM;
  const slot = WIDTH / Math.max(1, buckets.length);
  const barWidth = Math.max(1, slot * 0.72);
  const scale = peak ? plot / peak : 0;
  const chart = svg('svg', {
    class: 'chart', viewBox: `0 0 ${WIDTH} ${HEIGHT}`,
    role: 'img', 'aria-label': summary, testid: 'chart',
    'data-success': success, 'data-failed': failed, 'data-buckets': buckets.length,
  }, svg('title', { text: summary }));
  // Grid lines at the top and the middle of the scale, and the baseline.
  for (const y of [TOP, TOP + plot / 2]) {
    chart.append(svg('line', { class: 'grid', x1: 0, x2: WIDTH, y1: y, y2: y }));
  }
  chart.append(svg('line', { class: 'axis', x1: 0, x2: WIDTH, y1: TOP + plot, y2: TOP + plot }));
  buckets.forEach((b, i) => {
    const x = i * slot + (slot - barWidth) / 2;
    const okHeight = b.success * scale;
    const badHeight = b.failed * scale;
    const base = TOP + plot;
    const group = svg('g', { class: 'bucket' },
      svg('title', { text: `${formatTime(b.start)}: ${b.success} delivered, ${b.failed} failed` }),
      // A full-height transparent target, so the title shows on hover over an empty minute too.
      svg('rect', { class: 'hover', x: i * slot, y: TOP, width: slot, height: plot }));
    if (b.success) {
      group.append(svg('rect', {
        class: 'bar-ok', x, width: barWidth, y: base - okHeight, height: okHeight,
      }));
    }
    if (b.failed) {
      group.append(svg('rect', {
        class: 'bar-failed', x, width: barWidth, y: base - okHeight - badHeight, height: badHeight,
      }));
    }
    chart.append(group);
  });
  const label = (x, anchor, text) => svg('text', {
    class: 'tick', x, y: HEIGHT - 4, 'text-anchor': anchor, text,
  });
  chart.append(label(2, 'start', '60 min ago'), label(WIDTH / 2, 'middle', '30 min ago'),
    label(WIDTH - 2, 'end', 'now'));
  if (peak) {
    chart.append(svg('text', { class: 'tick', x: 2, y: TOP + 10, text: `${peak}/min` }));
  }
  const legend = h('p', { class: 'legend', testid: 'chart-legend' },
    h('span', { class: 'swatch ok', 'aria-hidden': 'true' }), `${success} delivered`,
    h('span', { class: 'swatch failed', 'aria-hidden': 'true' }), `${failed} failed`,
    success + failed === 0 ? h('span', { class: 'muted' }, ' — no attempts in the last hour') : null);
  return h('div', {}, chart, legend);
}
