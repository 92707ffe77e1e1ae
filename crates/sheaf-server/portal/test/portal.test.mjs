// Drives the Sheaf portal in Debian's Chromium (through playwright-core, never a downloaded
// browser) against a running `sheaf serve`, with a loopback webhook receiver of its own.
//
//   SHEAF_URL=http://127.0.0.1:PORT SHEAF_API_KEY=… PORTAL_SCREENSHOTS=/tmp/shots node portal.test.mjs
//
// CHROMIUM names the browser (default /usr/bin/chromium). The server must run with
// SHEAF_TOKEN_SIGNING_KEY set, SHEAF_ALLOW_PRIVATE_DESTINATIONS=true (the receiver is on
// loopback) and SHEAF_RETRY_MAX_ATTEMPTS=1 (a failed delivery is dead-lettered at once).
// Every step is bounded; the whole run stops itself after RUN_TIMEOUT_MS. Exit code 0 only when
// every step passed.

import { mkdirSync } from 'node:fs';
import http from 'node:http';
import { join } from 'node:path';
import { chromium } from 'playwright-core';

const SHEAF_URL = (process.env.SHEAF_URL || '').replace(/\/+$/, '');
const API_KEY = process.env.SHEAF_API_KEY || '';
const SHOTS = process.env.PORTAL_SCREENSHOTS || 'portal-screenshots';
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const RUN_TIMEOUT_MS = 200_000;
const STEP_TIMEOUT_MS = 45_000;
const UI_TIMEOUT_MS = 15_000;

if (!SHEAF_URL || !API_KEY) {
  console.error('portal test: set SHEAF_URL and SHEAF_API_KEY');
  process.exit(2);
}
mkdirSync(SHOTS, { recursive: true });

// Unique per run, so a server that keeps its log across runs still shows this run's events.
const RUN = `${Date.now().toString(36)}`;
const TENANT_A = 'portal-a';
const TENANT_B = 'portal-b';

const watchdog = setTimeout(() => {
  console.error(`portal test: FAILED: the run took longer than ${RUN_TIMEOUT_MS / 1000} s`);
  process.exit(1);
}, RUN_TIMEOUT_MS);

// ---------------------------------------------------------------------------------------------
// The webhook receiver: 200, or 500 with a short body while `failing`; each request numbered in
// the order it arrived.

const receiver = { failing: false, got: new Map(), requests: 0 };
const server = http.createServer((req, res) => {
  const chunks = [];
  req.on('data', (c) => chunks.push(c));
  req.on('end', () => {
    const id = req.headers['webhook-id'];
    if (id) {
      if (!receiver.got.has(id)) receiver.got.set(id, []);
      receiver.requests += 1;
      receiver.got.get(id).push({
        failing: receiver.failing, body: Buffer.concat(chunks).toString(), n: receiver.requests,
      });
    }
    if (receiver.failing) {
      res.writeHead(500, { 'content-type': 'text/plain' });
      res.end('receiver is failing on purpose');
    } else {
      res.writeHead(200, { 'content-type': 'text/plain' });
      res.end('ok');
    }
  });
});
server.keepAliveTimeout = 1000;
await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
const HOOK_URL = `http://127.0.0.1:${server.address().port}/hook`;

// ---------------------------------------------------------------------------------------------
// Helpers

async function api(method, path, body, key = API_KEY) {
  const response = await fetch(SHEAF_URL + path, {
    method,
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
    signal: AbortSignal.timeout(10_000),
  });
  const text = await response.text();
  let json = null;
  try { json = text ? JSON.parse(text) : null; } catch { json = text; }
  return { status: response.status, body: json };
}

async function apiOk(method, path, body, statuses = [200, 201, 202, 204]) {
  const answer = await api(method, path, body);
  if (!statuses.includes(answer.status)) {
    throw new Error(`${method} ${path} answered ${answer.status}: ${JSON.stringify(answer.body)}`);
  }
  return answer.body;
}

/** Polls `check` (truthy to stop) every 200 ms for at most `ms`; throws with `what`. */
async function until(what, check, ms = 20_000) {
  const deadline = Date.now() + ms;
  let last;
  while (Date.now() < deadline) {
    last = await check();
    if (last) return last;
    await new Promise((r) => setTimeout(r, 200));
  }
  throw new Error(`timed out after ${ms / 1000} s waiting for ${what}`);
}

function expect(condition, message) {
  if (!condition) throw new Error(message);
}

const publish = (id, data) => apiOk('POST', '/api/v1/publish',
  { tenant_id: TENANT_A, id, topic: 'order.created', data });

const attemptsOf = async (eventId) =>
  (await apiOk('GET', `/api/v1/tenants/${TENANT_A}/attempts?event_id=${encodeURIComponent(eventId)}&limit=100`)).items;

// ---------------------------------------------------------------------------------------------
// The browser, and what the page logs

const browser = await chromium.launch({
  executablePath: CHROMIUM,
  headless: true,
  timeout: 30_000,
  args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking',
    '--disable-component-update', '--disable-sync', '--no-first-run', '--disable-quic'],
});

const problems = [];
// Console errors this step provokes on purpose (the failed fetches of a forbidden call).
let expectedConsole = [];
let currentStep = 'setup';

async function newPage() {
  const context = await browser.newContext({ viewport: { width: 1280, height: 860 } });
  const page = await context.newPage();
  page.setDefaultTimeout(UI_TIMEOUT_MS);
  page.on('console', (message) => {
    if (message.type() !== 'error') return;
    const text = message.text();
    if (expectedConsole.some((re) => re.test(text))) return;
    problems.push(`${currentStep}: console error: ${text}`);
  });
  page.on('pageerror', (error) => problems.push(`${currentStep}: page error: ${error.message}`));
  return page;
}

const shot = (page, name) => page.screenshot({ path: join(SHOTS, name), fullPage: true });

const results = [];
async function step(name, body) {
  currentStep = name;
  const started = Date.now();
  let timer;
  try {
    await Promise.race([
      body(),
      new Promise((_, reject) => {
        timer = setTimeout(() => reject(new Error(`step took longer than ${STEP_TIMEOUT_MS / 1000} s`)), STEP_TIMEOUT_MS);
      }),
    ]);
    const logged = problems.filter((p) => p.startsWith(`${name}:`));
    if (logged.length) throw new Error(logged.join('\n'));
    results.push([name, true]);
    console.log(`ok   ${name} (${((Date.now() - started) / 1000).toFixed(1)} s)`);
    return true;
  } catch (error) {
    results.push([name, false]);
    console.log(`FAIL ${name}: ${error.message}`);
    return false;
  } finally {
    clearTimeout(timer);
  }
}

// ---------------------------------------------------------------------------------------------
// The steps. A failed step stops the run: the later ones build on it.

let page;
let link;
let destinationId;
const ids = [1, 2, 3].map((n) => `portal-${RUN}-${n}`);
const failedId = `portal-${RUN}-4`;

const steps = [
  ['a. tenants and a portal link through the API', async () => {
    for (const tenant of [TENANT_A, TENANT_B]) {
      // A fresh tenant, so its destination list starts empty on a reused server too.
      await apiOk('DELETE', `/api/v1/tenants/${tenant}`, undefined, [204, 404]);
      await apiOk('PUT', `/api/v1/tenants/${tenant}`, { metadata: { purpose: 'portal test' } });
    }
    link = await apiOk('POST', `/api/v1/tenants/${TENANT_A}/portal`);
    expect(typeof link.url === 'string' && link.url.includes('#tenant='), `a link: ${JSON.stringify(link)}`);
    expect(link.url.includes(link.token), 'the link carries the token');
  }],

  ['b. the link opens the empty destinations screen', async () => {
    page = await newPage();
    await page.goto(link.url);
    await page.getByTestId('destinations-empty').waitFor();
    const url = page.url();
    expect(!url.includes('token=') && !url.includes('sheaf_tt1_'), `the token left the address bar: ${url}`);
    expect(url.endsWith('#/destinations'), `at #/destinations: ${url}`);
    expect(await page.getByTestId('tenant').textContent() === TENANT_A, 'the header names the tenant');
    const expiry = await page.getByTestId('expiry').textContent();
    expect(/^expires in (59 min|60 min|1 h)$/.test(expiry), `the expiry shows: ${expiry}`);
    expect(await page.evaluate(() => localStorage.length + sessionStorage.length) === 0
      && await page.evaluate(() => document.cookie) === '', 'nothing stored in the browser');
    await shot(page, '01-destinations-empty.png');
  }],

  ['c. a webhook created in the page, its secret shown once', async () => {
    await page.getByTestId('create-url').fill(HOOK_URL);
    // Topics match exactly (the API has no prefix patterns): two of them, one the events use.
    await page.getByTestId('create-topics').fill('order.created, order.paid');
    await page.getByTestId('create-submit').click();
    const secret = await page.getByTestId('secret-value').textContent();
    expect(/^whsec_/.test(secret), `a secret: ${secret}`);
    const row = page.getByTestId('destination-row');
    await row.waitFor();
    expect(await row.getByTestId('destination-url').textContent() === HOOK_URL, 'the row shows the URL');
    expect((await row.getByTestId('destination-topics').textContent()).includes('order.created'), 'the row shows the topics');
    expect(await row.getByTestId('destination-status').textContent() === 'enabled', 'enabled');
    destinationId = await row.getAttribute('data-id');
    await shot(page, '02-destination-created.png');
    await page.getByTestId('secret-dismiss').click();
    await page.getByTestId('secret-box').waitFor({ state: 'detached' });
    // Shown once: reloading the list does not show it again.
    await page.getByTestId('nav-events').click();
    await page.getByTestId('nav-destinations').click();
    await page.getByTestId('destination-row').waitFor();
    expect(await page.getByTestId('secret-box').count() === 0, 'the secret is not shown again');
    expect(!(await page.textContent('body')).includes(secret), 'the secret is not in the page');
  }],

  ['d. three published events are listed', async () => {
    for (const [n, id] of ids.entries()) await publish(id, { order: n + 1, total: 10 * (n + 1), note: '<b>not markup</b>' });
    await until('the receiver to get three events', () => ids.every((id) => receiver.got.has(id)));
    await until('their attempts in the log', async () => {
      for (const id of ids) if ((await attemptsOf(id)).length === 0) return false;
      return true;
    });
    await page.getByTestId('nav-events').click();
    await page.getByTestId('event-row').first().waitFor();
    const listed = await page.getByTestId('event-row').evaluateAll((rows) => rows.map((r) => r.dataset.id));
    for (const id of ids) expect(listed.includes(id), `${id} is listed: ${listed}`);
    expect(listed.indexOf(ids[2]) < listed.indexOf(ids[0]), 'newest first');
    // The topic filter keeps them; another topic has none.
    await page.getByTestId('filter-topic').fill('order.shipped');
    await page.getByTestId('filter-apply').click();
    await page.getByTestId('events-empty').waitFor();
    await page.getByTestId('filter-topic').fill('order.created');
    await page.getByTestId('filter-range').selectOption('1h');
    await page.getByTestId('event-row').first().waitFor();
    await shot(page, '03-events.png');
  }],

  ['e. one event with its successful attempt', async () => {
    await page.locator(`[data-testid=event-row][data-id="${ids[0]}"] [data-testid=event-link]`).click();
    const attempt = page.getByTestId('attempt').first();
    await attempt.waitFor();
    expect(await attempt.getByTestId('attempt-status').textContent() === 'success', 'status success');
    expect(await attempt.getByTestId('attempt-code').textContent() === 'HTTP 200', 'code 200');
    const payload = JSON.parse(await page.getByTestId('event-payload').textContent());
    expect(payload.order === 1 && payload.note === '<b>not markup</b>', 'the payload, as text');
    expect(await page.locator('#main b').count() === 0, 'no markup from the payload');
    await shot(page, '04-event.png');
  }],

  ['f. a failed delivery, dead-lettered, then retried by hand', async () => {
    receiver.failing = true;
    await publish(failedId, { order: 4, total: 40 });
    await until('the receiver to refuse it', () => receiver.got.has(failedId));
    await until('the failed attempt in the log', async () => (await attemptsOf(failedId)).length > 0);
    await until('the dead letter', async () =>
      (await apiOk('GET', `/api/v1/tenants/${TENANT_A}/dead-letters`)).items.some((d) => d.event_id === failedId));
    // Within the page (the session is in its memory only), as a link to the event would.
    await page.evaluate((id) => { window.location.hash = `#/events/${encodeURIComponent(id)}`; }, failedId);
    const failed = page.locator('[data-testid=attempt][data-status=failed]');
    await failed.waitFor();
    expect(await failed.getByTestId('attempt-code').textContent() === 'HTTP 500', 'code 500');
    expect((await failed.getByTestId('attempt-body').textContent()).includes('failing on purpose'), 'the response excerpt');
    await page.getByTestId('nav-dead-letters').click();
    await page.locator(`[data-testid=dead-letter-row][data-event-id="${failedId}"]`).waitFor();
    await shot(page, '05-dead-letters.png');
    receiver.failing = false;
    await page.locator(`[data-testid=dead-letter-row][data-event-id="${failedId}"] a`).first().click();
    await page.locator('[data-testid=attempt][data-status=failed]').waitFor();
    await page.getByTestId('retry').click();
    const retried = page.locator('[data-testid=attempt][data-status=success][data-trigger=manual]');
    await retried.waitFor({ timeout: 20_000 });
    expect(await retried.getByTestId('attempt-code').textContent() === 'HTTP 200', 'the retry got 200');
    expect(await page.getByTestId('attempt').count() === 2, 'two attempts in the timeline');
    await shot(page, '06-retried.png');
  }],

  ['g. the chart counts deliveries and failures', async () => {
    await until('the stats to count the attempts', async () => {
      const stats = await apiOk('GET', `/api/v1/tenants/${TENANT_A}/stats/attempts?minutes=60`);
      const sum = (f) => stats.buckets.reduce((n, b) => n + b[f], 0);
      return sum('success') >= 4 && sum('failed') >= 1;
    });
    await page.getByTestId('nav-events').click();
    const chart = page.getByTestId('chart');
    await chart.waitFor();
    const success = Number(await chart.getAttribute('data-success'));
    const failed = Number(await chart.getAttribute('data-failed'));
    expect(success >= 1 && failed >= 1, `the chart shows ${success} delivered, ${failed} failed`);
    expect(Number(await chart.getAttribute('data-buckets')) === 60, 'sixty minutes');
    const label = await chart.getAttribute('aria-label');
    expect(label.includes(`${success} delivered`) && label.includes(`${failed} failed`), `labelled: ${label}`);
    expect(await chart.locator('rect.bar-failed').count() >= 1, 'a failure bar');
    await chart.scrollIntoViewIfNeeded();
    await shot(page, '07-chart.png');
  }],

  ['h. a token for one tenant cannot read another', async () => {
    const token = (await apiOk('POST', `/api/v1/tenants/${TENANT_A}/tokens`, { ttl_seconds: 600 })).token;
    page = await newPage();
    expectedConsole = [/status of 403/];
    await page.goto(`${SHEAF_URL}/portal/#tenant=${TENANT_B}&token=${encodeURIComponent(token)}`);
    await page.getByTestId('destinations-error').waitFor();
    await page.getByTestId('nav-events').click();
    const alert = page.locator('[data-testid=events-error][role=alert]');
    await alert.waitFor();
    const words = await alert.textContent();
    expect(words.includes('403') && words.includes('forbidden'), `the 403 in words: ${words}`);
    expect(await page.getByTestId('event-row').count() === 0, 'no events listed');
    await shot(page, '08-forbidden.png');
    expectedConsole = [];
  }],

  ['i. an admin signs in with the key and picks a tenant', async () => {
    page = await newPage();
    await page.goto(`${SHEAF_URL}/portal/`);
    await page.getByTestId('signin-key').fill(API_KEY);
    await page.getByTestId('signin-tenant').fill(TENANT_A);
    await page.getByTestId('signin-submit').click();
    const row = page.getByTestId('destination-row');
    await row.waitFor();
    expect(await row.getAttribute('data-id') === destinationId, 'the destination made in step c');
    expect(await page.getByTestId('admin-badge').isVisible(), 'the header says admin key');
    await shot(page, '09-admin.png');
  }],

  ['j. an Ed25519 webhook shows its public key, and again on demand', async () => {
    await page.getByTestId('create-url').fill(HOOK_URL);
    await page.getByTestId('create-topics').fill('order.shipped');
    await page.getByTestId('create-signing').selectOption('ed25519');
    await page.getByTestId('create-submit').click();
    const shown = await page.getByTestId('public-key-value').textContent();
    expect(/^whpk_/.test(shown), `a public key: ${shown}`);
    const listed = (await apiOk('GET', `/api/v1/tenants/${TENANT_A}/destinations`)).items
      .find((d) => d.credentials.algorithm === 'ed25519');
    expect(listed && listed.credentials.public_key === shown, 'the key the API shows');
    expect(listed.credentials.secret === null, 'no secret for an Ed25519 key');
    await shot(page, '10-ed25519-public-key.png');
    await page.getByTestId('public-key-dismiss').click();
    await page.getByTestId('public-key-box').waitFor({ state: 'detached' });
    const row = page.locator(`[data-testid=destination-row][data-id="${listed.id}"]`);
    await row.waitFor();
    expect(await row.getByTestId('destination-signing').textContent() === 'ed25519', 'the row names the algorithm');
    await row.getByTestId('destination-public-key').click();
    expect(await page.getByTestId('public-key-value').textContent() === shown, 'shown again');
    expect(!(await page.textContent('body')).includes('whsk_'), 'no private key in the page');
  }],

  ['k. a transformation tried next to the settings, saved, and applied to deliveries', async () => {
    const row = page.locator(`[data-testid=destination-row][data-id="${destinationId}"]`);
    await row.getByTestId('destination-edit').click();
    const form = page.getByTestId('destination-edit-form');
    await form.waitFor();
    const program = 'if .data.total < 20 then empty else {order: .data.order, cents: (.data.total * 100)} end';
    // The refused program's 400 is logged by the browser, on purpose.
    expectedConsole = [/status of 400/];
    await form.getByTestId('edit-transform').fill('{order: .data.order');
    await form.locator('[data-testid=try-panel] summary').click();
    await form.getByTestId('try-event').fill(JSON.stringify({ topic: 'order.created', data: { order: 7, total: 25 } }));
    await form.getByTestId('try-run').click();
    const refused = await form.getByTestId('try-error').textContent();
    expect(refused.includes('line 1'), `a syntax error names its place: ${refused}`);
    expectedConsole = [];
    await form.getByTestId('edit-transform').fill(program);
    await form.getByTestId('try-run').click();
    const tried = JSON.parse(await form.getByTestId('try-body').textContent());
    expect(tried.order === 7 && tried.cents === 2500 && tried.total === undefined, `the dry run's body: ${JSON.stringify(tried)}`);
    await shot(page, '11-transformation-tried.png');
    await form.getByTestId('edit-save').click();
    await row.getByTestId('destination-transformed').waitFor();
    const saved = await apiOk('GET', `/api/v1/tenants/${TENANT_A}/destinations/${destinationId}`);
    expect(saved.transform === program, `saved: ${saved.transform}`);

    const [shaped, dropped] = [`portal-${RUN}-5`, `portal-${RUN}-6`];
    await publish(shaped, { order: 5, total: 50 });
    await publish(dropped, { order: 6, total: 6 });
    await until('the transformed delivery', () => receiver.got.has(shaped));
    const body = JSON.parse(receiver.got.get(shaped)[0].body);
    expect(body.order === 5 && body.cents === 5000 && body.total === undefined, `the receiver got ${JSON.stringify(body)}`);
    await until('the filtered attempt', async () => (await attemptsOf(dropped)).some((a) => a.status === 'filtered'));
    expect(!receiver.got.has(dropped), 'a dropped event is not sent');
    await page.evaluate((id) => { window.location.hash = `#/events/${encodeURIComponent(id)}`; }, dropped);
    const filtered = page.locator('[data-testid=attempt][data-status=filtered]');
    await filtered.waitFor();
    expect(await filtered.getByTestId('attempt-status').textContent() === 'filtered', 'the timeline says filtered');
    await shot(page, '12-filtered.png');
  }],

  ['l. a dead letter that blocks its key, retried from the list; another discarded', async () => {
    await apiOk('PATCH', `/api/v1/tenants/${TENANT_A}/destinations/${destinationId}`,
      { ordering: { key: '/data/order', on_dead_letter: 'block' } });
    const [blocking, behind, gone] = [`portal-${RUN}-7`, `portal-${RUN}-8`, `portal-${RUN}-9`];
    const deadOf = async (id) => (await apiOk('GET', `/api/v1/tenants/${TENANT_A}/dead-letters`))
      .items.find((d) => d.event_id === id);
    receiver.failing = true;
    await publish(blocking, { order: 70, total: 70 });
    await publish(gone, { order: 90, total: 90 });
    await until('both dead letters', async () => (await deadOf(blocking)) && (await deadOf(gone)));
    receiver.failing = false;
    await publish(behind, { order: 70, total: 71 });
    const held = await deadOf(blocking);
    expect(held.blocks_key === true, `the dead letter blocks its key: ${JSON.stringify(held)}`);
    await page.getByTestId('nav-dead-letters').click();
    const row = page.locator(`[data-testid=dead-letter-row][data-job-id="${held.job_id}"]`);
    await row.getByTestId('blocks-key').waitFor();
    await shot(page, '13-dead-letter-blocks-its-key.png');
    expect(!receiver.got.has(behind), 'the later event of the key waits for its dead letter');
    await row.getByTestId('dead-letter-retry').click();
    await row.getByTestId('retry-queued').waitFor();
    await until('the retried event, then the one it held back', () =>
      receiver.got.get(blocking)?.some((r) => !r.failing) && receiver.got.has(behind));
    const delivered = receiver.got.get(blocking).find((r) => !r.failing).n;
    expect(receiver.got.get(behind)[0].n > delivered, 'the held-back event after the retried one');
    expect(!(await deadOf(blocking)), 'a retried dead letter leaves the list');

    const other = page.locator(`[data-testid=dead-letter-row][data-job-id="${(await deadOf(gone)).job_id}"]`);
    await other.getByTestId('dead-letter-discard').click();
    await other.getByTestId('dead-letter-discard-confirm').click();
    await other.getByTestId('discarded').waitFor();
    expect(!(await deadOf(gone)), 'a discarded dead letter leaves the list');
    await shot(page, '14-dead-letters-retried-and-discarded.png');
  }],
];

for (const [name, body] of steps) {
  if (!(await step(name, body))) break;
}

const passed = results.filter(([, ok]) => ok).length;
const failed = results.length - passed;
const skipped = steps.length - results.length;
console.log(`portal: ${passed} passed, ${failed} failed${skipped ? `, ${skipped} skipped` : ''}`);
console.log(`screenshots in ${SHOTS}`);
clearTimeout(watchdog);
await browser.close().catch(() => {});
server.close();
server.closeAllConnections?.();
process.exit(failed === 0 && skipped === 0 ? 0 : 1);
