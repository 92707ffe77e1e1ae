// #/destinations: the tenant's destinations; create a webhook (signed with an HMAC secret or an
// Ed25519 key), edit it, enable or disable it, rotate its key, delete it after a confirmation in
// the page. An HMAC secret is shown once, right after it is made, in a box the reader dismisses;
// an Ed25519 destination's public key can be shown at any time (it verifies, it cannot sign).

import * as api from './api.js';
import { chartCard } from './chart.js';
import {
  h, replace, alertBox, loading, emptyState, button, whileBusy, field, badge,
} from './ui.js';

/** The signing secret in a destination (or a rotation's answer); empty for an Ed25519 key. */
const secretOf = (d) => d?.credentials?.secret ?? '';

/** The public key of a destination signing with Ed25519, else null. */
const publicKeyOf = (d) => d?.credentials?.public_key ?? null;

const SIGNING = [['hmac-sha256', 'HMAC-SHA256 (shared secret)'], ['ed25519', 'Ed25519 (public key)']];

const parseTopics = (text) => text.split(/[\s,]+/).map((t) => t.trim()).filter(Boolean);

export function render(root, { signal }) {
  const notice = h('div', { class: 'notice-slot', 'aria-live': 'polite' });
  const list = h('div', { testid: 'destinations' }, loading('Loading destinations…'));

  function showSecret(title, secret) {
    replace(notice, h('div', { class: 'card secret-box', testid: 'secret-box', role: 'status' },
      h('h3', {}, title),
      h('p', {}, 'Use it to verify the webhook-signature header of each delivery. ',
        h('strong', {}, 'It won’t be shown again'), ': copy it now.'),
      h('code', { class: 'secret', testid: 'secret-value' }, secret),
      h('div', { class: 'actions' },
        button('Copy', (e) => copy(e.currentTarget, secret), { class: 'btn small' }),
        button('Dismiss', () => notice.replaceChildren(),
          { class: 'btn small', testid: 'secret-dismiss' }))));
  }

  function showPublicKey(title, key) {
    replace(notice, h('div', { class: 'card secret-box', testid: 'public-key-box', role: 'status' },
      h('h3', {}, title),
      h('p', {}, 'Deliveries carry a v1a Ed25519 signature in webhook-signature: verify it with this ',
        'public key. It cannot sign, so it may be shared or published.'),
      h('code', { class: 'secret', testid: 'public-key-value' }, key),
      h('div', { class: 'actions' },
        button('Copy', (e) => copy(e.currentTarget, key), { class: 'btn small' }),
        button('Dismiss', () => notice.replaceChildren(),
          { class: 'btn small', testid: 'public-key-dismiss' }))));
  }

  /** A new key's box: the secret once, or the public key. */
  function showKey(title, d) {
    const key = publicKeyOf(d);
    if (key) showPublicKey(title.replace('signing secret', 'public key'), key);
    else showSecret(title, secretOf(d));
  }

  async function load() {
    try {
      const page = await api.listDestinations({ signal });
      replace(list, table(page.items));
    } catch (error) {
      if (error.name !== 'AbortError') replace(list, alertBox(error, 'destinations-error'));
    }
  }

  function table(items) {
    if (!items.length) {
      return emptyState('destinations-empty', 'No destinations yet',
        'Add a webhook above: Sheaf will POST every matching event to it.');
    }
    return h('table', { class: 'table' },
      h('thead', {}, h('tr', {}, ['Type', 'URL', 'Topics', 'Status', 'Failures', ''].map(
        (t) => h('th', { scope: 'col' }, t)))),
      h('tbody', {}, items.map(row)));
  }

  function row(d) {
    const tr = h('tr', { testid: 'destination-row', 'data-id': d.id });
    const status = h('td', {});
    const message = h('div', { class: 'row-message', 'aria-live': 'polite' });

    function fill() {
      replace(status, d.enabled ? badge('enabled', 'ok', 'destination-status')
        : badge('disabled', 'off', 'destination-status'),
      d.disabled_reason ? h('span', { class: 'muted small block' }, d.disabled_reason.reason) : null);
      replace(tr,
        h('td', {}, h('span', { class: 'type' }, d.type),
          h('span', { class: 'muted small block', testid: 'destination-signing' },
            d.credentials?.algorithm ?? ''),
          d.transform ? h('span', { class: 'muted small block', testid: 'destination-transformed' }, 'transformed') : null),
        h('td', { class: 'url' }, h('code', { testid: 'destination-url' }, d.config?.url ?? ''),
          h('span', { class: 'muted small block mono' }, d.id)),
        h('td', { testid: 'destination-topics' }, d.topics.map((t) => h('span', { class: 'chip' }, t))),
        status,
        h('td', { class: 'num', testid: 'destination-failures' }, String(d.consecutive_failures ?? 0)),
        h('td', { class: 'row-actions' }, actions(), message));
    }

    function actions() {
      return h('div', { class: 'actions' },
        button('Edit', edit, { class: 'btn small', testid: 'destination-edit' }),
        button(d.enabled ? 'Disable' : 'Enable', (e) => act(e.currentTarget, async () => {
          d = await api.setDestinationEnabled(d.id, !d.enabled, { signal });
          fill();
        }), { class: 'btn small', testid: 'destination-toggle' }),
        publicKeyOf(d) ? button('Public key', () => showPublicKey('Public key', publicKeyOf(d)),
          { class: 'btn small', testid: 'destination-public-key' }) : null,
        button(publicKeyOf(d) ? 'Rotate key' : 'Rotate secret', (e) => act(e.currentTarget, async () => {
          const rotated = await api.rotateSecret(d.id, { signal });
          showKey('New signing secret', rotated);
          if (rotated && rotated.id === d.id) d = rotated;
          fill();
        }), { class: 'btn small', testid: 'destination-rotate' }),
        button('Delete', confirmDelete, { class: 'btn small danger', testid: 'destination-delete' }));
    }

    async function act(btn, work) {
      message.replaceChildren();
      try {
        await whileBusy(btn, work);
      } catch (error) {
        if (error.name !== 'AbortError') replace(message, alertBox(error));
      }
    }

    function confirmDelete() {
      const yes = button('Delete', (e) => act(e.currentTarget, async () => {
        await api.deleteDestination(d.id, { signal });
        tr.remove();
        load();
      }), { class: 'btn small danger', testid: 'destination-delete-confirm' });
      replace(tr.lastElementChild, h('div', { class: 'confirm', testid: 'delete-confirmation' },
        h('p', {}, 'Delete this destination? Its pending deliveries stop.'),
        h('div', { class: 'actions' }, yes, button('Cancel', fill, { class: 'btn small' }))),
      message);
      yes.focus();
    }

    function edit() {
      const url = h('input', { type: 'url', required: true, value: d.config?.url ?? '', testid: 'edit-url' });
      const topics = h('input', { type: 'text', required: true, value: d.topics.join(', '), testid: 'edit-topics' });
      const program = h('textarea', {
        class: 'mono', rows: 4, spellcheck: 'false', testid: 'edit-transform',
        placeholder: '{order: .data.id, total: .data.total}',
      });
      program.value = d.transform ?? '';
      const form = h('form', { class: 'edit-form', testid: 'destination-edit-form' },
        d.type === 'webhook' ? field('URL', url) : null,
        field('Topics', topics, 'Comma-separated exact topics, or * alone for every topic'),
        field('Transformation', program,
          'A jq program from the event ({id, topic, data, metadata}) to the body sent; empty sends the data as published, no output drops the event'),
        tryPanel(program),
        h('div', { class: 'actions' },
          h('button', { type: 'submit', class: 'btn small primary', testid: 'edit-save' }, 'Save'),
          button('Cancel', fill, { class: 'btn small' })), message);
      form.addEventListener('submit', (e) => {
        e.preventDefault();
        const body = { topics: parseTopics(topics.value), transform: program.value.trim() || null };
        if (d.type === 'webhook') body.config = { ...d.config, url: url.value.trim() };
        act(form.querySelector('[type=submit]'), async () => {
          d = await api.updateDestination(d.id, body, { signal });
          fill();
        });
      });
      replace(tr, h('td', { colspan: 6 }, form));
      (d.type === 'webhook' ? url : topics).focus();
    }

    fill();
    return tr;
  }

  /** The dry run next to a transformation: an event to try it on, and what a receiver would get. */
  function tryPanel(program) {
    const sample = h('textarea', { class: 'mono', rows: 4, spellcheck: 'false', testid: 'try-event' });
    sample.value = JSON.stringify({ topic: 'order.paid', data: { id: 'ord_1', total: 250 } }, null, 2);
    const result = h('div', { 'aria-live': 'polite', testid: 'try-result' });
    const run = button('Try it', async (e) => {
      result.replaceChildren();
      let event;
      try {
        event = JSON.parse(sample.value);
      } catch (error) {
        replace(result, alertBox(new Error(`The event is not JSON: ${error.message}`), 'try-error'));
        return;
      }
      await whileBusy(e.currentTarget, async () => {
        try {
          const out = await api.tryTransformation({ transform: program.value, event }, { signal });
          const said = {
            send: 'A receiver would get this body',
            drop: 'The event is dropped: nothing is sent, the attempt is recorded as filtered',
            failed: 'The attempt would fail, and not be retried',
          }[out.result];
          replace(result, h('div', { class: 'try-out', 'data-result': out.result },
            h('p', { class: 'muted small' }, said),
            out.result === 'send' ? h('pre', { class: 'excerpt', testid: 'try-body' }, JSON.stringify(out.body, null, 2)) : null,
            Object.keys(out.headers).length ? h('pre', { class: 'excerpt', testid: 'try-headers' },
              Object.entries(out.headers).map(([k, v]) => `${k}: ${v}`).join('\n')) : null,
            out.error ? h('p', { class: 'attempt-error', testid: 'try-failure' }, out.error) : null));
        } catch (error) {
          if (error.name !== 'AbortError') replace(result, alertBox(error, 'try-error'));
        }
      });
    }, { class: 'btn small', testid: 'try-run' });
    return h('details', { class: 'try-panel', testid: 'try-panel' },
      h('summary', {}, 'Try the transformation'),
      field('Event', sample, 'An event to run it on: {"topic", "data"}'),
      h('div', { class: 'actions' }, run), result);
  }

  root.append(h('div', { class: 'screen-head' }, h('h1', {}, 'Destinations'),
    h('p', { class: 'muted' }, 'Where this tenant’s events are delivered.')),
  createForm(), notice, h('section', { class: 'card' }, list), chartCard(signal));
  load();

  function createForm() {
    const url = h('input', {
      type: 'url', required: true, placeholder: 'https://example.com/webhooks', testid: 'create-url',
    });
    const topics = h('input', { type: 'text', required: true, value: '*', testid: 'create-topics' });
    const signing = h('select', { testid: 'create-signing' }, SIGNING.map(([value, label]) =>
      h('option', { value }, label)));
    const submit = h('button', { type: 'submit', class: 'btn primary', testid: 'create-submit' }, 'Add webhook');
    const message = h('div', { 'aria-live': 'polite' });
    const form = h('form', { class: 'card create-form', testid: 'create-form' },
      h('h2', {}, 'New webhook'),
      h('div', { class: 'row' }, field('URL', url),
        field('Topics', topics, 'Comma-separated exact topics, or * alone for every topic'),
        field('Signing', signing),
        h('div', { class: 'field field-submit' }, submit)), message);
    form.addEventListener('submit', async (e) => {
      e.preventDefault();
      message.replaceChildren();
      try {
        const created = await whileBusy(submit, () => api.createDestination({
          type: 'webhook',
          topics: parseTopics(topics.value),
          config: { url: url.value.trim() },
          signing: { algorithm: signing.value },
        }, { signal }));
        url.value = '';
        showKey('Webhook created: its signing secret', created);
        load();
      } catch (error) {
        if (error.name !== 'AbortError') replace(message, alertBox(error, 'create-error'));
      }
    });
    return form;
  }
}

async function copy(btn, text) {
  try {
    await navigator.clipboard.writeText(text);
    btn.textContent = 'Copied';
  } catch {
    btn.textContent = 'Select and copy it by hand';
  }
}
