/* funke dashboard — a dependency-free single-page app served by the JobManager.
 *
 * Routes (location.hash):  "#/" cluster overview,  "#/jobs" job list,  "#/jobs/<jid>" one job.
 * Each route is a view with load() (fetches JSON) and draw() (builds a DOM tree from it). The
 * router runs load + draw, swaps the tree into <main>, then polls again after the configured
 * refresh interval while the page is visible.
 *
 * Safety: text from the API only ever reaches the DOM via text nodes and setAttribute — there is
 * no innerHTML anywhere in this file.
 */

// === Palette and state sets ======================================================================

/** Colour per Flink state; DAG node rects use exactly these strings as their fill. */
const STATE_COLOURS = Object.freeze({
  CREATED: '#a7b0ba',
  SCHEDULED: '#9d8ad8',
  DEPLOYING: '#36aaa6',
  INITIALIZING: '#5cbfe0',
  RUNNING: '#2474c7',
  FINISHED: '#2f9e4f',
  CANCELING: '#f0ad4e',
  CANCELLING: '#f0ad4e',
  CANCELED: '#6c757d',
  FAILED: '#d63a3a',
  FAILING: '#ea6a3a',
  RESTARTING: '#c9a227',
  SUSPENDED: '#8a6d5a',
  RECONCILING: '#d6559a',
});
const UNKNOWN_COLOUR = '#cccccc';

/** Display order of states in legends, count chips and task bars. */
const STATE_ORDER = ['CREATED', 'SCHEDULED', 'DEPLOYING', 'INITIALIZING', 'RECONCILING', 'RUNNING',
  'FINISHED', 'CANCELING', 'CANCELLING', 'CANCELED', 'FAILING', 'FAILED', 'RESTARTING', 'SUSPENDED'];

/** Globally terminal job states: polling stops after one more refresh. */
const TERMINAL_JOB_STATES = new Set(['FINISHED', 'FAILED', 'CANCELED']);
/** States in which cancelling makes no sense (SUSPENDED: this JobManager no longer runs it). */
const NOT_CANCELLABLE = new Set([...TERMINAL_JOB_STATES, 'SUSPENDED', 'CANCELING', 'CANCELLING']);
/** Task states whose timeline segment ends where it starts (the attempt is over). */
const TERMINAL_TASK_STATES = new Set(['FINISHED', 'FAILED', 'CANCELED']);

const colourOf = (state) => STATE_COLOURS[state] || UNKNOWN_COLOUR;

/** Black or white text, whichever reads better on the given #rrggbb background. */
function textColourOn(hex) {
  const m = /^#([0-9a-f]{2})([0-9a-f]{2})([0-9a-f]{2})$/i.exec(hex);
  if (!m) return '#1d232a';
  const [r, g, b] = m.slice(1).map((x) => parseInt(x, 16) / 255)
    .map((c) => (c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4));
  const luminance = 0.2126 * r + 0.7152 * g + 0.0722 * b;
  return luminance > 0.3 ? '#1d232a' : '#ffffff';
}

// === Public hooks (used by tests and handy from the console) =====================================

const dashboard = {
  STATE_COLOURS,
  renders: 0,
  config: null,
  refresh: () => refreshNow(),
  layoutDag: (nodes) => layoutDag(nodes),
};
window.funkeDashboard = dashboard;

// === DOM helpers (text always goes in as text nodes) =============================================

const SVG_NS = 'http://www.w3.org/2000/svg';

const el = (tag, attrs, ...children) => build(document.createElement(tag), attrs, children);
const svg = (tag, attrs, ...children) => build(document.createElementNS(SVG_NS, tag), attrs, children);

/** Sets attributes (on* functions become listeners, style objects are assigned) and children. */
function build(node, attrs, children) {
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith('on') && typeof value === 'function') node.addEventListener(key.slice(2), value);
    else if (key === 'style' && typeof value === 'object') Object.assign(node.style, value);
    else node.setAttribute(key, value === true ? '' : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

const $ = (selector) => document.querySelector(selector);
const enc = encodeURIComponent;

// === Formatting ==================================================================================

const isTime = (ms) => typeof ms === 'number' && Number.isFinite(ms) && ms > 0;
/** Epoch ms from a number or an ISO string (Spark's progress records use ISO timestamps). */
const toMs = (t) => (typeof t === 'string' ? Date.parse(t) : t);
const numberFormat = new Intl.NumberFormat('en', { maximumFractionDigits: 1 });
const compactFormat = new Intl.NumberFormat('en', { notation: 'compact', maximumFractionDigits: 1 });
let timeParts = makeTimeFormatter(null);
let timeZoneLabel = '';

/** Formats in the cluster's time zone (config "timezone-name"), else by its offset, else locally. */
function makeTimeFormatter(config) {
  const opts = { year: 'numeric', month: '2-digit', day: '2-digit', hour: '2-digit',
    minute: '2-digit', second: '2-digit', hourCycle: 'h23' };
  let shift = 0;
  let fmt = new Intl.DateTimeFormat('en-GB', opts);
  const name = config && config['timezone-name'];
  const offset = config && config['timezone-offset'];
  try {
    if (name) fmt = new Intl.DateTimeFormat('en-GB', { ...opts, timeZone: name });
    timeZoneLabel = name || '';
  } catch {
    if (typeof offset === 'number') { // milliseconds east of UTC, as Flink's /config has it
      fmt = new Intl.DateTimeFormat('en-GB', { ...opts, timeZone: 'UTC' });
      shift = offset;
      const h = Math.abs(offset) / 36e5;
      timeZoneLabel = `UTC${offset < 0 ? '-' : '+'}${String(Math.floor(h)).padStart(2, '0')}:${String(Math.round((h % 1) * 60)).padStart(2, '0')}`;
    }
  }
  return (ms) => Object.fromEntries(fmt.formatToParts(ms + shift).map((p) => [p.type, p.value]));
}

function formatTime(ms) {
  if (!isTime(ms)) return '–';
  const p = timeParts(ms);
  return `${p.year}-${p.month}-${p.day} ${p.hour}:${p.minute}:${p.second}`;
}

function formatClock(ms, withMillis) {
  const p = timeParts(ms);
  const base = `${p.hour}:${p.minute}:${p.second}`;
  return withMillis ? `${base}.${String(Math.floor(ms % 1000)).padStart(3, '0')}` : base;
}

function formatDuration(ms) {
  if (typeof ms !== 'number' || !Number.isFinite(ms) || ms < 0) return '–';
  if (ms < 1000) return `${Math.round(ms)}ms`;
  const s = ms / 1000;
  if (s < 10) return `${s.toFixed(1)}s`;
  if (s < 60) return `${Math.floor(s)}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${Math.floor(s % 60)}s`;
  const h = Math.floor(m / 60);
  if (h < 24) return `${h}h ${m % 60}m`;
  return `${Math.floor(h / 24)}d ${h % 24}h`;
}

const formatNumber = (n) => (typeof n === 'number' && Number.isFinite(n) ? numberFormat.format(n) : '–');
const formatCompact = (n) => (typeof n === 'number' && Number.isFinite(n) ? compactFormat.format(n) : '–');

/** A count's table cell: compact, the exact number in its title and data-value ('' and '–': not measured). */
function countCell(n, attrs = {}) {
  const known = typeof n === 'number' && Number.isFinite(n);
  return el('td', { class: 'num', 'data-value': known ? String(n) : '', title: known ? formatNumber(n) : 'not measured',
    ...attrs }, formatCompact(n));
}

function formatBytes(n) {
  if (typeof n !== 'number' || !Number.isFinite(n) || n < 0) return '–';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}

// === REST access and login =======================================================================

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status; // 0: network error
  }
}

/** Human-readable error from an {"errors": [...]} body, else the status line. */
async function errorMessage(resp) {
  try {
    const body = await resp.json();
    if (body && Array.isArray(body.errors) && body.errors.length) return body.errors.map(String).join('; ');
  } catch { /* not JSON */ }
  return `${resp.status} ${resp.statusText || 'error'}`;
}

/** Fetches JSON. A 401 shows the login form and retries once the user has signed in. */
async function api(path, { method = 'GET', body } = {}) {
  for (;;) {
    let resp;
    try {
      resp = await fetch(path, {
        method,
        credentials: 'same-origin',
        cache: 'no-store',
        headers: body === undefined ? { Accept: 'application/json' }
          : { Accept: 'application/json', 'Content-Type': 'application/json' },
        body: body === undefined ? undefined : JSON.stringify(body),
      });
    } catch (err) {
      throw new ApiError(0, `Cannot reach the JobManager (${err.message}).`);
    }
    if (resp.status === 401) {
      await requestLogin(await errorMessage(resp));
      continue;
    }
    if (!resp.ok) throw new ApiError(resp.status, await errorMessage(resp));
    const text = await resp.text();
    if (!text) return {};
    try {
      return JSON.parse(text);
    } catch {
      throw new ApiError(resp.status, `The JobManager sent invalid JSON for ${path}.`);
    }
  }
}

/** The outcome of a promise without throwing: {value} or {error}. */
const settle = (promise) => promise.then((value) => ({ value }), (error) => ({ error }));

let loginPromise = null;

/** Shows the token form (once, however many requests got a 401); resolves after a good login. */
function requestLogin(reason) {
  if (!loginPromise) {
    loginPromise = new Promise((resolve) => {
      showLoginForm(reason, () => { loginPromise = null; resolve(); });
    });
  }
  return loginPromise;
}

function showLoginForm(reason, done) {
  const backdrop = $('#login');
  const form = $('#login-form');
  const input = $('#login-token');
  const error = $('#login-error');
  const submit = $('#login-submit');
  error.textContent = reason && !/^401\b/.test(reason) ? reason : '';
  backdrop.hidden = false;
  document.body.dataset.login = 'required';
  input.value = '';
  input.focus();
  form.onsubmit = async (event) => {
    event.preventDefault();
    const token = input.value.trim();
    if (!token) { error.textContent = 'Please enter the token.'; return; }
    submit.disabled = true;
    try {
      // The token only travels in this request; the server answers with an HttpOnly cookie.
      const resp = await fetch('/login', {
        method: 'POST',
        credentials: 'same-origin',
        headers: { 'Content-Type': 'application/json' },
        body: JSON.stringify({ token }),
      });
      if (resp.ok) {
        input.value = '';
        form.onsubmit = null;
        backdrop.hidden = true;
        delete document.body.dataset.login;
        done();
        return;
      }
      error.textContent = resp.status === 401 ? 'That token was not accepted.' : await errorMessage(resp);
    } catch (err) {
      error.textContent = `Cannot reach the JobManager (${err.message}).`;
    } finally {
      submit.disabled = false;
    }
  };
}

// === Small shared widgets ========================================================================

function badge(state) {
  const colour = colourOf(state);
  return el('span', { class: 'badge', style: { background: colour, color: textColourOn(colour) } },
    state || 'UNKNOWN');
}

/** A horizontal bar of task counts by state; counts: {STATE: n} (any case). */
function taskBar(counts) {
  const entries = Object.entries(counts || {})
    .map(([state, n]) => [state.toUpperCase(), Number(n) || 0])
    .filter(([, n]) => n > 0)
    .sort(([a], [b]) => STATE_ORDER.indexOf(a) - STATE_ORDER.indexOf(b));
  const label = entries.map(([s, n]) => `${n} ${s.toLowerCase()}`).join(', ') || 'no tasks';
  return el('div', { class: 'taskbar', role: 'img', 'aria-label': label, title: label },
    entries.map(([state, n]) => el('span', {
      class: 'taskbar-seg', title: `${state}: ${n}`,
      style: { flexGrow: String(n), background: colourOf(state) },
    })));
}

function legend(states) {
  return el('ul', { class: 'legend', 'aria-label': 'State colours' },
    states.map((s) => el('li', {}, el('span', { class: 'swatch', style: { background: colourOf(s) } }), s)));
}

function section(id, title, ...body) {
  return el('section', { id, class: 'card', 'aria-labelledby': `${id}-title` },
    el('h2', { id: `${id}-title` }, title), ...body);
}

function errorPanel(message) {
  return el('p', { class: 'error-panel', role: 'alert' }, message);
}

function definitionList(pairs) {
  return el('dl', { class: 'facts' },
    pairs.filter(Boolean).map(([k, v]) => [el('dt', {}, k), el('dd', {}, v)]));
}

function table(headers, rows, attrs = {}) {
  return el('table', { class: 'grid', ...attrs },
    el('thead', {}, el('tr', {}, headers.map((h) => el('th', { scope: 'col' }, h)))),
    el('tbody', {}, rows));
}

// === View: cluster overview ("#/") ===============================================================

const overviewView = {
  title: () => 'Overview',
  async load() {
    const [overview, tms] = await Promise.all([api('/overview'), api('/taskmanagers')]);
    return { overview, taskmanagers: tms.taskmanagers || [] };
  },
  draw({ overview, taskmanagers }) {
    const total = overview['slots-total'] ?? 0;
    const free = overview['slots-available'] ?? 0;
    const leader = overview.leader;
    const byState = Object.entries(overview['jobs-by-state'] || {})
      .sort(([a], [b]) => STATE_ORDER.indexOf(a) - STATE_ORDER.indexOf(b));
    return el('div', { class: 'page' },
      el('h1', {}, 'Cluster overview'),
      el('div', { class: 'stats' },
        stat('TaskManagers', overview.taskmanagers ?? taskmanagers.length, 'stat-taskmanagers'),
        stat('Task slots', total, 'stat-slots-total'),
        stat('Slots free', free, 'stat-slots-free'),
        stat('Slots used', Math.max(0, total - free), 'stat-slots-used'),
        stat('Running jobs', overview['jobs-running'] ?? 0, 'stat-jobs-running'),
        stat('Finished', overview['jobs-finished'] ?? 0, 'stat-jobs-finished'),
        stat('Cancelled', overview['jobs-cancelled'] ?? 0, 'stat-jobs-cancelled'),
        stat('Failed', overview['jobs-failed'] ?? 0, 'stat-jobs-failed')),
      section('jobs-by-state', 'Jobs by state',
        byState.length
          ? el('ul', { class: 'state-counts' }, byState.map(([s, n]) =>
            el('li', { 'data-job-state': s }, badge(s), el('span', { class: 'count' }, String(n)))))
          : el('p', { class: 'empty' }, 'No jobs yet.')),
      section('cluster-info', 'Cluster',
        definitionList([
          ['Version', overview['flink-version'] || '–'],
          ['Data directory', overview['data-dir'] || '–'],
          ['High availability', leader
            ? `${leader['high-availability']} (leader ${leader.address}, epoch ${leader.epoch})`
            : 'none'],
        ])),
      section('taskmanagers', 'TaskManagers', taskmanagerTable(taskmanagers)));
  },
};

function stat(label, value, id) {
  return el('div', { class: 'stat', id },
    el('span', { class: 'stat-value' }, String(value)), el('span', { class: 'stat-label' }, label));
}

function taskmanagerTable(taskmanagers) {
  if (!taskmanagers.length) return el('p', { class: 'empty' }, 'No TaskManager is registered.');
  const rows = taskmanagers.map((tm) => {
    const slots = tm.slotsNumber ?? 0;
    const free = tm.freeSlots ?? 0;
    const beat = tm.timeSinceLastHeartbeat;
    return el('tr', { 'data-taskmanager-id': tm.id },
      el('td', {}, el('code', {}, tm.id)),
      el('td', {}, tm.path || '–'),
      el('td', { class: 'num' }, `${slots - free} / ${slots}`),
      el('td', { class: 'num' }, String(free)),
      el('td', { class: beat > 10000 ? 'num warn' : 'num' },
        typeof beat === 'number' && beat >= 0 ? `${formatDuration(beat)} ago` : '–'),
      el('td', {}, formatTime(tm['registered-at'])),
      el('td', { class: 'num' }, String(tm.hardware?.cpuCores ?? '–')));
  });
  return table(['ID', 'Address', 'Slots used', 'Free', 'Last heartbeat', 'Registered', 'CPU cores'],
    rows, { id: 'taskmanager-table' });
}

// === View: job list ("#/jobs") ===================================================================

const jobsView = {
  title: () => 'Jobs',
  async load() {
    return (await api('/jobs/overview')).jobs || [];
  },
  draw(jobs) {
    const sorted = [...jobs].sort((a, b) => (b['start-time'] || 0) - (a['start-time'] || 0));
    const running = sorted.filter((j) => !TERMINAL_JOB_STATES.has(j.state));
    const done = sorted.filter((j) => TERMINAL_JOB_STATES.has(j.state));
    return el('div', { class: 'page' },
      el('h1', {}, 'Jobs'),
      section('running-jobs', `Running jobs (${running.length})`,
        running.length ? jobTable(running, 'running-jobs-table') : el('p', { class: 'empty' }, 'No running jobs.')),
      section('completed-jobs', `Completed jobs (${done.length})`,
        done.length ? jobTable(done, 'completed-jobs-table') : el('p', { class: 'empty' }, 'No completed jobs.')));
  },
};

function jobTable(jobs, id) {
  const rows = jobs.map((job) => {
    const tasks = { ...(job.tasks || {}) };
    const total = tasks.total ?? 0;
    delete tasks.total;
    return el('tr', { 'data-jid': job.jid, 'data-state': job.state },
      el('td', {}, el('a', { href: `#/jobs/${enc(job.jid)}` }, job.name || job.jid)),
      el('td', {}, el('code', {}, job.jid)),
      el('td', {}, job['job-type'] || '–'),
      el('td', {}, badge(job.state)),
      el('td', {}, formatTime(job['start-time'])),
      el('td', {}, formatTime(job['end-time'])),
      el('td', { class: 'num' }, formatDuration(job.duration)),
      el('td', { class: 'tasks-cell' }, taskBar(tasks), el('span', { class: 'tasks-total' }, String(total))));
  });
  return table(['Name', 'Job ID', 'Type', 'State', 'Start', 'End', 'Duration', 'Tasks'], rows, { id });
}

// === View: one job ("#/jobs/<jid>") ==============================================================

const jobView = {
  title: (data) => (data ? data.job.name || data.job.jid : 'Job'),
  async load(route) {
    const base = `/jobs/${enc(route.jid)}`;
    const job = await api(base); // a 404 here means the job is gone: the whole page says so
    const streaming = jobType(job) === 'STREAMING';
    const [exceptions, times, details, batches] = await Promise.all([
      settle(api(`${base}/exceptions`)),
      settle(api(`${base}/subtasktimes`)),
      settle(Promise.all((job.vertices || []).map((v) => api(`${base}/vertices/${enc(v.id)}`)))),
      streaming ? settle(api(`${base}/batches`).catch((err) => {
        if (err.status === 404) return { batches: [] }; // no batch has run yet
        throw err;
      })) : null,
    ]);
    return { job, exceptions, times, details, batches };
  },
  draw(data, view) {
    const { job } = data;
    return el('div', { class: 'page job-page' },
      jobHeader(job, view),
      dagSection(job, view),
      verticesSection(job, view),
      operatorsSection(job, view),
      jobType(job) === 'STREAMING' ? streamingSection(job, data.batches) : null,
      subtasksSection(job, data.details, view),
      timelineSection(job, data.times),
      exceptionsSection(job, data.exceptions));
  },
  afterLoad(data, error, view) {
    if (error) {
      if (error.status === 404) view.stopped = true; // the job is gone
      return;
    }
    // Poll a terminal job once more (to pick up the last updates), then stop.
    if (TERMINAL_JOB_STATES.has(data.job.state)) {
      if (view.terminalSeen) view.stopped = true;
      view.terminalSeen = true;
    } else {
      view.terminalSeen = false;
    }
  },
};

const jobType = (job) => job['job-type'] || job.plan?.type || 'BATCH';

function jobHeader(job, view) {
  const stamps = Object.entries(job.timestamps || {})
    .filter(([, t]) => isTime(t)).sort(([, a], [, b]) => a - b);
  const canCancel = !NOT_CANCELLABLE.has(job.state) && dashboard.config?.features?.['web-cancel'] !== false;
  return el('header', { class: 'card job-header', id: 'job-header' },
    el('div', { class: 'job-title-row' },
      el('h1', { id: 'job-name' }, job.name || job.jid),
      badge(job.state),
      el('span', { class: 'job-type' }, jobType(job)),
      el('span', { class: 'spacer' }),
      job.isStoppable ? el('button', { id: 'stop-job', type: 'button', class: 'button',
        disabled: view.busy, onclick: () => stopJob(job, view) }, 'Stop') : null,
      canCancel ? el('button', { id: 'cancel-job', type: 'button', class: 'button danger',
        disabled: view.busy, onclick: () => cancelJob(job, view) }, 'Cancel job') : null),
    view.message ? el('p', { id: 'action-message', class: `action-message ${view.message.kind}`, role: 'status' },
      view.message.text) : null,
    job['waiting-for-resources']
      ? el('p', { class: 'notice', id: 'waiting-for-resources' }, job['waiting-for-resources']) : null,
    definitionList([
      ['Job ID', el('code', {}, job.jid)],
      ['Start', formatTime(job['start-time'])],
      ['End', formatTime(job['end-time'])],
      ['Duration', formatDuration(job.duration)],
      ['Restart strategy', job['restart-strategy'] || '–'],
      ['Failover strategy', job['failover-strategy'] || '–'],
    ]),
    stamps.length ? el('ol', { class: 'timestamps', 'aria-label': 'State timestamps' },
      stamps.map(([state, t]) => el('li', { 'data-timestamp-state': state }, badge(state), ' ', formatTime(t)))) : null);
}

/** Runs a job action (cancel/stop): disables the buttons, reports the outcome, refreshes. */
async function jobAction(view, run, successText) {
  view.busy = true;
  redraw();
  try {
    const result = await run();
    view.message = { kind: 'ok', text: result?.message || successText };
    view.terminalSeen = false;
    view.stopped = false;
  } catch (err) {
    view.message = { kind: 'error', text: err.message };
  } finally {
    view.busy = false;
  }
  if (app.view === view) {
    redraw();
    refreshNow();
  }
}

function cancelJob(job, view) {
  if (!window.confirm(`Cancel job "${job.name || job.jid}" (${job.jid})?`)) return;
  jobAction(view, () => api(`/jobs/${enc(job.jid)}?mode=cancel`, { method: 'PATCH' }),
    'Cancellation requested.');
}

function stopJob(job, view) {
  jobAction(view, () => api(`/jobs/${enc(job.jid)}/stop`, { method: 'POST', body: { drain: false } }),
    'Stop requested.');
}

// --- job graph (DAG) ------------------------------------------------------------------------

/**
 * Layered layout of the plan's DAG (a small Sugiyama). Layer of a node = longest path from a
 * source. An edge spanning several layers gets a virtual node in each layer it crosses, so it is
 * routed around real nodes. Within a layer, alternating sweeps sort nodes by the barycenter of
 * their neighbours above (going down) or below (going up), which removes most crossings.
 * Returns {layers: [[id, ...]], virtual: Set of virtual ids, edges: [{from, to, input, chain}]}
 * where chain lists the ids an edge passes through, from its source to its target.
 */
function layoutDag(nodes) {
  const ids = new Set(nodes.map((n) => n.id));
  const parents = new Map(nodes.map((n) => [n.id, []]));
  const edges = [];
  for (const node of nodes) {
    for (const input of node.inputs || []) {
      if (!ids.has(input.id)) continue;
      edges.push({ from: input.id, to: node.id, input });
      parents.get(node.id).push(input.id);
    }
  }
  const layerOf = new Map();
  const visiting = new Set();
  const depth = (id) => {
    if (layerOf.has(id)) return layerOf.get(id);
    if (visiting.has(id)) return 0; // a cycle (should not happen): break it here
    visiting.add(id);
    const d = Math.max(-1, ...parents.get(id).map(depth)) + 1;
    visiting.delete(id);
    layerOf.set(id, d);
    return d;
  };
  nodes.forEach((n) => depth(n.id));

  const layers = [];
  for (const n of nodes) (layers[layerOf.get(n.id)] ||= []).push(n.id);
  // Split long edges into chains through virtual nodes; record neighbours along the chains.
  const virtual = new Set();
  const up = new Map([...ids].map((id) => [id, []]));
  const down = new Map([...ids].map((id) => [id, []]));
  edges.forEach((edge, e) => {
    edge.chain = [edge.from];
    for (let l = layerOf.get(edge.from) + 1; l < layerOf.get(edge.to); l += 1) {
      const v = `\u0000${e}:${l}`;
      virtual.add(v);
      layers[l].push(v);
      up.set(v, []);
      down.set(v, []);
      edge.chain.push(v);
    }
    edge.chain.push(edge.to);
    for (let k = 1; k < edge.chain.length; k += 1) {
      up.get(edge.chain[k]).push(edge.chain[k - 1]);
      down.get(edge.chain[k - 1]).push(edge.chain[k]);
    }
  });
  // Position = index centred around 0, so layers of different sizes line up in the middle.
  const pos = new Map();
  const place = (layer) => layer.forEach((id, i) => pos.set(id, i - (layer.length - 1) / 2));
  layers.forEach(place);
  const barycenter = (id, neighbours) => {
    const ns = neighbours.get(id);
    return ns.length ? ns.reduce((s, n) => s + pos.get(n), 0) / ns.length : pos.get(id);
  };
  for (let sweep = 0; sweep < 4; sweep += 1) {
    const goingDown = sweep % 2 === 0;
    const order = goingDown ? layers.slice(1) : layers.slice(0, -1).reverse();
    for (const layer of order) {
      const key = new Map(layer.map((id) => [id, barycenter(id, goingDown ? up : down)]));
      layer.sort((a, b) => key.get(a) - key.get(b) || pos.get(a) - pos.get(b)); // stable
      place(layer);
    }
  }
  return { layers, virtual, edges };
}

/** Greedy word wrap for SVG text (which cannot wrap by itself); ellipsis after maxLines. */
function wrapText(text, maxChars, maxLines) {
  const words = String(text).split(/\s+/).filter(Boolean)
    .flatMap((w) => (w.length > maxChars ? w.match(new RegExp(`.{1,${maxChars}}`, 'g')) : [w]));
  const lines = [];
  for (const word of words) {
    const last = lines[lines.length - 1];
    if (last !== undefined && `${last} ${word}`.length <= maxChars) lines[lines.length - 1] = `${last} ${word}`;
    else lines.push(word);
  }
  if (lines.length > maxLines) {
    lines.length = maxLines;
    lines[maxLines - 1] = `${lines[maxLines - 1].slice(0, maxChars - 1)}…`;
  }
  return lines.length ? lines : [''];
}

const DAG = { nodeW: 232, nodeH: 96, virtualH: 14, gapX: 130, gapY: 30, margin: 16 };

function dagSection(job, view) {
  const nodes = job.plan?.nodes || [];
  const vertices = new Map((job.vertices || []).map((v) => [v.id, v]));
  if (!nodes.length) return section('job-graph', 'Job graph', el('p', { class: 'empty' }, 'No plan available.'));
  const present = new Set(nodes.map((n) => vertices.get(n.id)?.status || 'CREATED'));
  return section('job-graph', 'Job graph',
    el('div', { class: 'dag-scroll' }, drawDag(nodes, vertices, view)),
    legend(STATE_ORDER.filter((s) => present.has(s))),
    el('p', { class: 'hint' }, 'Click a vertex to show only its subtasks. Dashed edges are blocking exchanges.'));
}

function drawDag(nodes, vertices, view) {
  const { nodeW, nodeH, virtualH, gapX, gapY, margin } = DAG;
  const { layers, virtual, edges } = layoutDag(nodes);
  const heightOf = (id) => (virtual.has(id) ? virtualH : nodeH);
  const layerH = layers.map((l) => l.reduce((s, id) => s + heightOf(id), 0) + (l.length - 1) * gapY);
  const tallest = Math.max(...layerH);
  const box = new Map(); // id -> {x, y, h}
  layers.forEach((layer, li) => {
    let y = margin + (tallest - layerH[li]) / 2;
    for (const id of layer) {
      box.set(id, { x: margin + li * (nodeW + gapX), y, h: heightOf(id) });
      y += heightOf(id) + gapY;
    }
  });
  const ports = edgePorts(edges, box);
  const width = margin * 2 + layers.length * nodeW + (layers.length - 1) * gapX;
  const height = margin * 2 + tallest;
  const byId = new Map(nodes.map((n) => [n.id, n]));
  return svg('svg', { id: 'job-graph-svg', class: 'dag', width, height, viewBox: `0 0 ${width} ${height}`,
    role: 'group', 'aria-label': 'Job graph' },
  svg('defs', {}, svg('marker', { id: 'dag-arrow', viewBox: '0 0 10 10', refX: 10, refY: 5,
    markerWidth: 8, markerHeight: 8, orient: 'auto-start-reverse' },
  svg('path', { d: 'M0,0 L10,5 L0,10 z', class: 'dag-arrowhead' }))),
  edges.map((e, i) => drawEdge(e, box, ports[i])),
  nodes.map((n) => drawNode(n, vertices.get(n.id), box.get(n.id), view)));
}

/**
 * Spreads the edges leaving (and entering) a node along its right (left) side, ordered by where
 * their other end is, so parallel edges neither overlap nor cross at the node.
 * Returns per edge {out: y at the source, in: y at the target}.
 */
function edgePorts(edges, box) {
  const ports = edges.map(() => ({}));
  const centre = (id) => box.get(id).y + box.get(id).h / 2;
  const assign = (key, side, neighbour) => {
    const groups = new Map();
    edges.forEach((e, i) => {
      const id = side === 'out' ? e.chain[0] : e.chain[e.chain.length - 1];
      if (!groups.has(id)) groups.set(id, []);
      groups.get(id).push(i);
    });
    for (const [id, list] of groups) {
      list.sort((a, b) => centre(neighbour(edges[a])) - centre(neighbour(edges[b])) || a - b);
      const b = box.get(id);
      list.forEach((i, k) => { ports[i][key] = b.y + (b.h * (k + 1)) / (list.length + 1); });
    }
  };
  assign('out', 'out', (e) => e.chain[1]);
  assign('in', 'in', (e) => e.chain[e.chain.length - 2]);
  return ports;
}

/** An edge as smooth curves through its virtual nodes, labelled in the gap before its target. */
function drawEdge(edge, box, port) {
  const { nodeW, gapX } = DAG;
  const { chain } = edge;
  const curve = (x1, y1, x2, y2) => {
    const dx = Math.max(30, (x2 - x1) / 2);
    return [x1, y1, x1 + dx, y1, x2 - dx, y2, x2, y2];
  };
  let x = box.get(chain[0]).x + nodeW;
  let y = port.out;
  let d = `M${x},${y}`;
  let last = null;
  for (let k = 1; k < chain.length; k += 1) {
    const b = box.get(chain[k]);
    const ty = k === chain.length - 1 ? port.in : b.y + b.h / 2;
    last = curve(x, y, b.x, ty);
    d += ` C${last[2]},${last[3]} ${last[4]},${last[5]} ${last[6]},${last[7]}`;
    x = b.x + nodeW;
    y = ty;
    if (k < chain.length - 1) d += ` L${x},${y}`; // straight through a virtual node's column
  }
  const point = bezierAtX(last, last[6] - gapX / 2);
  const ship = edge.input.ship_strategy || '';
  const pattern = edge.input['distribution-pattern'] || '';
  const exchange = edge.input.exchange || '';
  const labelW = Math.max(ship.length, pattern.length) * 6.6 + 10;
  return svg('g', { class: `dag-edge${exchange === 'blocking' ? ' blocking' : ''}`,
    'data-source': edge.from, 'data-target': edge.to },
  svg('title', {}, `${edge.from} → ${edge.to}: ${[ship, pattern, exchange].filter(Boolean).join(', ')}`),
  svg('path', { d, class: 'dag-edge-line', 'marker-end': 'url(#dag-arrow)' }),
  svg('rect', { class: 'dag-edge-label-bg', x: point.x - labelW / 2, y: point.y - 13, width: labelW,
    height: 26, rx: 4 }),
  svg('text', { class: 'dag-edge-label', x: point.x, y: point.y - 2, 'text-anchor': 'middle' }, ship),
  svg('text', { class: 'dag-edge-sublabel', x: point.x, y: point.y + 9, 'text-anchor': 'middle' }, pattern));
}

/** Point of a cubic Bézier [x0,y0,cx1,cy1,cx2,cy2,x1,y1] (x monotonic here) at x, by bisection. */
function bezierAtX(c, x) {
  const at = (t, i) => {
    const u = 1 - t;
    return u * u * u * c[i] + 3 * u * u * t * c[i + 2] + 3 * u * t * t * c[i + 4] + t * t * t * c[i + 6];
  };
  let lo = 0; let hi = 1;
  for (let k = 0; k < 30; k += 1) {
    const mid = (lo + hi) / 2;
    if (at(mid, 0) < x) lo = mid; else hi = mid;
  }
  return { x: at(lo, 0), y: at(lo, 1) };
}

function drawNode(node, vertex, b, view) {
  const { nodeW, nodeH } = DAG;
  const status = vertex?.status || 'CREATED';
  const fill = colourOf(status);
  const ink = textColourOn(fill);
  const name = vertex?.name || node.description || node.id;
  const selected = view.selected === node.id;
  const lines = wrapText(name, 26, 2);
  const counts = Object.entries(vertex?.tasks || {}).filter(([, n]) => n > 0)
    .sort(([a], [c]) => STATE_ORDER.indexOf(a) - STATE_ORDER.indexOf(c));
  // Chips "2 running  1 finished"; just the numbers when the names do not fit.
  const named = counts.reduce((len, [s, n]) => len + `${n} ${s}`.length + 3, 0) <= 30;
  const select = () => selectVertex(view, selected ? null : node.id);
  let chipX = b.x + 10;
  return svg('g', {
    class: `dag-node${selected ? ' selected' : ''}`, 'data-vertex-id': node.id, 'data-state': status,
    fill, tabindex: 0, role: 'button', 'aria-pressed': String(selected),
    'aria-label': `${name}, ${status}, parallelism ${node.parallelism}`,
    onclick: select,
    onkeydown: (ev) => { if (ev.key === 'Enter' || ev.key === ' ') { ev.preventDefault(); select(); } },
  },
  svg('title', {}, `${name}\n${status} · parallelism ${node.parallelism}`),
  svg('rect', { class: 'dag-node-box', x: b.x, y: b.y, width: nodeW, height: nodeH, rx: 6, fill }),
  lines.map((line, i) => svg('text', { class: 'dag-node-name', x: b.x + 10, y: b.y + 21 + i * 16, fill: ink }, line)),
  svg('text', { class: 'dag-node-meta', x: b.x + 10, y: b.y + 62, fill: ink },
    `Parallelism: ${node.parallelism ?? vertex?.parallelism ?? '?'}`),
  counts.map(([state, n]) => {
    const label = named ? `${n} ${state.toLowerCase()}` : String(n);
    const chip = svg('g', { class: 'dag-node-count', 'data-count-state': state },
      svg('title', {}, `${state}: ${n}`),
      svg('rect', { x: chipX, y: b.y + nodeH - 22, width: 10, height: 10, rx: 2,
        fill: colourOf(state), class: 'dag-chip' }),
      svg('text', { x: chipX + 14, y: b.y + nodeH - 13, fill: ink, class: 'dag-chip-label' }, label));
    chipX += 26 + label.length * 6.5;
    return chip;
  }));
}

function selectVertex(view, vid) {
  view.selected = vid;
  redraw();
}

// --- vertices, subtasks ---------------------------------------------------------------------

function verticesSection(job, view) {
  const rows = (job.vertices || []).map((v) => {
    const m = v.metrics || {};
    return el('tr', { 'data-vertex': v.id, class: view.selected === v.id ? 'selected' : null },
      el('td', {}, el('button', { type: 'button', class: 'link', 'aria-pressed': String(view.selected === v.id),
        onclick: () => selectVertex(view, view.selected === v.id ? null : v.id) }, v.name || v.id)),
      el('td', {}, badge(v.status)),
      el('td', { class: 'num' }, String(v.parallelism ?? '–')),
      countCell(m['read-records'], { 'data-metric': 'read-records' }),
      countCell(m['write-records'], { 'data-metric': 'write-records' }),
      el('td', { class: 'num', 'data-metric': 'read-bytes' }, formatBytes(m['read-bytes'])),
      el('td', { class: 'num', 'data-metric': 'write-bytes' }, formatBytes(m['write-bytes'])),
      el('td', {}, formatTime(v['start-time'])),
      el('td', { class: 'num' }, formatDuration(v.duration)),
      el('td', { class: 'tasks-cell' }, taskBar(v.tasks)));
  });
  return section('vertices', 'Vertices',
    rows.length ? table(['Name', 'Status', 'Parallelism', 'Records in', 'Records out', 'Bytes in',
      'Bytes out', 'Start', 'Duration', 'Tasks'], rows, { id: 'vertex-table' })
      : el('p', { class: 'empty' }, 'No vertices.'));
}

/** Each vertex's chain, operator by operator: the records each received and emitted (a source's
 * records in are the records it read, a sink's records out the records it wrote). */
function operatorsSection(job, view) {
  const rows = (job.vertices || []).flatMap((v) => (v.operators || []).map((o) => {
    const m = o.metrics || {};
    const value = (n) => (typeof n === 'number' && Number.isFinite(n) ? String(n) : '');
    return el('tr', { 'data-operator': `${v.id}/${o.index}`, 'data-records-in': value(m['read-records']),
      'data-records-out': value(m['write-records']), class: view.selected === v.id ? 'selected' : null },
    el('td', { class: o.index === 0 ? null : 'muted' }, o.index === 0 ? (v.name || v.id) : '↳'),
    el('td', {}, o.name || '–'),
    countCell(m['read-records']),
    countCell(m['write-records']));
  }));
  return section('operators', 'Operators',
    rows.length ? table(['Vertex', 'Operator', 'Records in', 'Records out'], rows, { id: 'operator-table' })
      : el('p', { class: 'empty' }, 'No operators.'));
}

function subtasksSection(job, details, view) {
  const vertices = job.vertices || [];
  // Toggle buttons rather than a <select>: a poll would close an open drop-down.
  const pick = (vid, label) => el('button', { type: 'button', class: 'chip', 'data-pick-vertex': vid,
    'aria-pressed': String((view.selected || '') === vid), onclick: () => selectVertex(view, vid || null) }, label);
  const picker = el('div', { id: 'vertex-picker', class: 'picker', role: 'group', 'aria-label': 'Show subtasks of' },
    pick('', 'All vertices'), vertices.map((v) => pick(v.id, v.name || v.id)));
  if (details.error) return section('subtasks', 'Subtasks', picker, errorPanel(details.error.message));
  const shown = details.value.filter((d) => !view.selected || d.id === view.selected);
  return section('subtasks', 'Subtasks', picker,
    shown.map((d) => el('div', { class: 'subtask-group', 'data-subtask-vertex': d.id },
      el('h3', {}, d.name || d.id, el('span', { class: 'muted' }, ` · parallelism ${d.parallelism ?? '?'}`)),
      subtaskTable(d))),
    shown.length ? null : el('p', { class: 'empty' }, 'No subtasks.'));
}

function subtaskTable(vertex) {
  const rows = (vertex.subtasks || []).map((s) => {
    const perState = Object.entries(s['status-duration'] || {})
      .filter(([, ms]) => typeof ms === 'number' && ms >= 0)
      .map(([state, ms]) => `${state} ${formatDuration(ms)}`).join(', ');
    return el('tr', { 'data-subtask': `${vertex.id}/${s.subtask}`, 'data-state': s.status },
      el('td', { class: 'num' }, String(s.subtask)),
      el('td', { class: 'num' }, String(s.attempt ?? '–')),
      el('td', { title: perState || null }, badge(s.status)),
      el('td', {}, s['taskmanager-id'] ? el('code', {}, s['taskmanager-id']) : '–',
        s.host ? el('span', { class: 'muted' }, ` ${s.host}`) : null),
      el('td', { class: 'num' }, s.slot === null || s.slot === undefined ? '–' : String(s.slot)),
      countCell((s.metrics || {})['read-records'], { 'data-metric': 'read-records' }),
      countCell((s.metrics || {})['write-records'], { 'data-metric': 'write-records' }),
      el('td', {}, formatTime(s['start-time'])),
      el('td', { class: 'num' }, formatDuration(s.duration)));
  });
  return table(['Subtask', 'Attempt', 'State', 'TaskManager', 'Slot', 'Records in', 'Records out', 'Start', 'Duration'],
    rows, { class: 'grid subtasks' });
}

// --- timeline (Gantt) -----------------------------------------------------------------------

const TIMELINE = { labelW: 260, plotW: 860, rowH: 20, axisH: 26, pad: 12 };

/** "Nice" tick step (ms) so that [t0, t1] gets at most ~maxTicks ticks. */
function tickStep(span, maxTicks) {
  const steps = [100, 200, 500, 1e3, 2e3, 5e3, 1e4, 15e3, 3e4, 6e4, 12e4, 3e5, 6e5, 9e5, 18e5,
    36e5, 72e5, 108e5, 216e5, 432e5, 864e5];
  return steps.find((s) => span / s <= maxTicks) || Math.ceil(span / maxTicks / 864e5) * 864e5;
}

function timelineSection(job, times) {
  if (times.error) return section('timeline', 'Timeline', errorPanel(times.error.message));
  const order = new Map((job.vertices || []).map((v, i) => [v.id, i]));
  const attempts = [...(times.value.attempts || [])].sort((a, b) =>
    (order.get(a.vertex) ?? 1e9) - (order.get(b.vertex) ?? 1e9) || a.subtask - b.subtask || a.attempt - b.attempt);
  if (!attempts.some((a) => (a.states || []).some((s) => isTime(s.start)))) {
    return section('timeline', 'Timeline', el('p', { class: 'empty' }, 'No attempts yet.'));
  }
  const present = new Set(attempts.flatMap((a) => (a.states || []).map((s) => s.state)));
  return section('timeline', 'Timeline',
    el('div', { class: 'timeline-scroll' }, drawTimeline(attempts, times.value.now || Date.now())),
    legend(STATE_ORDER.filter((s) => present.has(s))));
}

function drawTimeline(attempts, now) {
  const { labelW, plotW, rowH, axisH, pad } = TIMELINE;
  const all = attempts.flatMap((a) => a.states || []).filter((s) => isTime(s.start));
  const t0 = Math.min(...all.map((s) => s.start).filter(isTime));
  let t1 = Math.max(...all.map((s) => (isTime(s.end) ? s.end : TERMINAL_TASK_STATES.has(s.state) ? s.start : now)));
  if (!(t1 > t0)) t1 = t0 + 1000;
  const x = (t) => labelW + ((t - t0) / (t1 - t0)) * plotW;
  const width = labelW + plotW + pad * 2;
  const height = axisH + attempts.length * rowH + pad;
  const step = tickStep(t1 - t0, 8);
  const ticks = [];
  for (let t = Math.ceil(t0 / step) * step; t <= t1; t += step) ticks.push(t);

  return svg('svg', { id: 'timeline-svg', class: 'timeline', width, height, viewBox: `0 0 ${width} ${height}`,
    role: 'img', 'aria-label': `Timeline of ${attempts.length} attempts` },
  svg('g', { class: 'timeline-axis' },
    ticks.map((t) => svg('g', {},
      svg('line', { x1: x(t), x2: x(t), y1: axisH - 6, y2: height - pad, class: 'timeline-grid' }),
      svg('text', { x: x(t), y: axisH - 10, 'text-anchor': 'middle' }, formatClock(t, step < 1000))))),
  attempts.map((a, i) => timelineRow(a, axisH + i * rowH, x, now)));
}

function timelineRow(attempt, y, x, now) {
  const { labelW, rowH } = TIMELINE;
  const label = `${attempt['vertex-name'] || attempt.vertex} (${attempt.subtask}) #${attempt.attempt}`;
  const where = [attempt['taskmanager-id'], attempt.slot !== null && attempt.slot !== undefined
    ? `slot ${attempt.slot}` : ''].filter(Boolean).join(', ');
  return svg('g', { class: 'timeline-row', 'data-attempt': `${attempt.vertex}/${attempt.subtask}/${attempt.attempt}` },
    svg('title', {}, where ? `${label} on ${where}` : label),
    svg('text', { class: 'timeline-label', x: labelW - 8, y: y + rowH / 2 + 4, 'text-anchor': 'end' },
      label.length > 40 ? `${label.slice(0, 18)}…${label.slice(-21)}` : label),
    (attempt.states || []).filter((s) => isTime(s.start)).map((s) => {
      // A terminal state has no length (end null or equal to start): draw it as a 3px mark.
      const terminal = TERMINAL_TASK_STATES.has(s.state);
      const end = isTime(s.end) ? s.end : terminal ? s.start : now;
      const left = x(s.start);
      const w = Math.max(terminal ? 3 : 1, x(end) - left);
      const span = terminal && end === s.start ? formatTime(s.start)
        : `${formatTime(s.start)} – ${isTime(s.end) ? formatTime(s.end) : 'now'} (${formatDuration(end - s.start)})`;
      return svg('rect', { class: 'timeline-seg', 'data-state': s.state, x: left, y: y + 3, width: w,
        height: rowH - 6, fill: colourOf(s.state) }, svg('title', {}, `${s.state}: ${span}`));
    }));
}

// --- exceptions -----------------------------------------------------------------------------

function exceptionsSection(job, exceptions) {
  const failure = job.failure;
  const body = [];
  const entries = exceptions.value?.exceptionHistory?.entries || [];
  if (failure) {
    const sameAsRoot = entries.length && entries[0].stacktrace === failure.traceback;
    body.push(el('article', { class: 'job-failure', id: 'job-failure' },
      el('h3', {}, 'Job failure: ', el('span', { class: 'exception-name' }, failure.exception || 'Error')),
      failure.message ? el('p', { class: 'exception-message' }, failure.message) : null,
      failure.traceback && !sameAsRoot ? el('pre', { class: 'exception' }, failure.traceback) : null));
  }
  if (exceptions.error) {
    body.push(errorPanel(exceptions.error.message));
  } else if (entries.length) {
    body.push(el('ol', { class: 'exception-list' }, entries.map((e, i) => exceptionEntry(e, i === 0))));
    if (exceptions.value.exceptionHistory.truncated) {
      body.push(el('p', { class: 'muted' }, 'Older exceptions were dropped from the history.'));
    }
  } else if (exceptions.value?.['root-exception']) {
    body.push(el('article', { class: 'exception-entry root' },
      el('h3', {}, 'Root exception', el('span', { class: 'muted' }, ` · ${formatTime(exceptions.value.timestamp)}`)),
      el('pre', { class: 'exception' }, exceptions.value['root-exception'])));
  } else if (!failure) {
    body.push(el('p', { class: 'empty' }, 'No exceptions.'));
  }
  return section('exceptions', 'Exceptions', body);
}

function exceptionEntry(entry, root) {
  const tm = [entry.taskManagerId, entry.location].filter(Boolean).join(' · ');
  return el('li', { class: `exception-entry${root ? ' root' : ''}` },
    el('div', { class: 'exception-head' },
      root ? el('span', { class: 'tag' }, 'root cause') : null,
      el('strong', { class: 'exception-name' }, entry.exceptionName || 'Exception'),
      el('span', {}, ` · ${formatTime(entry.timestamp)}`)),
    definitionList([
      ['Task', entry.taskName || '–'],
      ['TaskManager', tm || '–'],
    ]),
    el('pre', { class: 'exception' }, entry.stacktrace || '(no traceback)'));
}

// --- streaming charts -----------------------------------------------------------------------

const CHART = { w: 360, h: 170, left: 52, right: 14, top: 12, bottom: 30 };

function streamingSection(job, batches) {
  const list = (batches?.value?.batches || []).filter((b) => typeof b.batchId === 'number');
  const recent = [...list].sort((a, b) => a.batchId - b.batchId).slice(-120);
  const series = (key) => recent.filter((b) => typeof b[key] === 'number' && Number.isFinite(b[key]))
    .map((b) => ({ x: b.batchId, y: b[key] }));
  // keyed state, summed over the query's keyed operators
  const withState = recent.filter((b) => Array.isArray(b.state) && b.state.length);
  const stateSeries = (key) => withState.map((b) => ({
    x: b.batchId, y: b.state.reduce((n, o) => n + (Number(o[key]) || 0), 0) }));
  const latest = recent.length ? recent[recent.length - 1] : null;
  const progress = job['latest-progress'];
  return section('streaming', 'Streaming query',
    batches?.error ? errorPanel(batches.error.message) : null,
    el('div', { class: 'charts' },
      lineChart('chart-input-rate', 'Input rows/s', series('inputRowsPerSecond')),
      lineChart('chart-processing-rate', 'Processed rows/s', series('processedRowsPerSecond')),
      lineChart('chart-batch-duration', 'Batch duration (ms)', series('durationMs')),
      withState.length ? lineChart('chart-state-keys', 'State: keys held', stateSeries('keys')) : null,
      withState.length ? lineChart('chart-state-bytes', 'State on disk (bytes)', stateSeries('bytesOnDisk')) : null,
      series('lateRows').length ? lineChart('chart-late-rows', 'Late rows', series('lateRows')) : null),
    el('p', { class: 'muted' }, `${list.length} micro-batches`
      + (recent.length ? `, latest #${recent[recent.length - 1].batchId} at ${formatTime(toMs(recent[recent.length - 1].timestamp))}` : '')
      // event time: the watermark the latest batch ran with (an event time, UTC)
      + (latest && typeof latest.watermark === 'number' ? `, watermark ${formatTime(latest.watermark)}` : '')),
    progress ? el('details', { class: 'progress' }, el('summary', {}, 'Latest progress record'),
      el('pre', { class: 'progress-json' }, JSON.stringify(progress, null, 2))) : null);
}

/** Round a maximum up to 1, 2 or 5 × 10^k for the y axis. */
function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = 10 ** Math.floor(Math.log10(v));
  return [1, 2, 5, 10].map((m) => m * p).find((m) => m >= v);
}

function lineChart(id, title, points) {
  const { w, h, left, right, top, bottom } = CHART;
  const latest = points.length ? formatNumber(points[points.length - 1].y) : '–';
  const chart = svg('svg', { id, class: 'chart', width: w, height: h, viewBox: `0 0 ${w} ${h}`,
    role: 'img', 'aria-label': `${title}: latest ${latest}` });
  const figure = el('figure', { class: 'chart-figure' },
    el('figcaption', {}, title, el('span', { class: 'chart-latest' }, latest)), chart);
  if (!points.length) {
    chart.append(svg('text', { x: w / 2, y: h / 2, 'text-anchor': 'middle', class: 'chart-empty' }, 'No batches yet'));
    return figure;
  }
  const x0 = points[0].x;
  const x1 = points[points.length - 1].x === x0 ? x0 + 1 : points[points.length - 1].x;
  const yMax = niceMax(Math.max(...points.map((p) => p.y)));
  const sx = (v) => left + ((v - x0) / (x1 - x0)) * (w - left - right);
  const sy = (v) => top + (1 - v / yMax) * (h - top - bottom);
  chart.append(...[ // append() would stringify a nested array: spread a flat one
    [0, yMax / 2, yMax].map((v) => svg('g', { class: 'chart-ytick' },
      svg('line', { x1: left, x2: w - right, y1: sy(v), y2: sy(v), class: 'chart-grid' }),
      svg('text', { x: left - 6, y: sy(v) + 4, 'text-anchor': 'end' }, formatCompact(v)))),
    svg('text', { x: left, y: h - 8, class: 'chart-xlabel' }, `batch ${x0}`),
    svg('text', { x: w - right, y: h - 8, 'text-anchor': 'end', class: 'chart-xlabel' }, `batch ${points[points.length - 1].x}`),
    svg('polyline', { class: 'chart-line', fill: 'none',
      points: points.map((p) => `${sx(p.x).toFixed(1)},${sy(p.y).toFixed(1)}`).join(' ') }),
    points.length <= 60 ? points.map((p) => svg('circle', { class: 'chart-point', cx: sx(p.x), cy: sy(p.y), r: 2.5,
      'data-batch-id': p.x }, svg('title', {}, `batch ${p.x}: ${formatNumber(p.y)}`))) : [],
  ].flat());
  return figure;
}

// === Router, rendering and polling ===============================================================

const VIEWS = { overview: overviewView, jobs: jobsView, job: jobView };

/** Route state. `view` is recreated on every navigation and holds per-page UI state. */
const app = { route: null, view: null, generation: 0, timer: null };

function parseRoute(hash) {
  const path = hash.replace(/^#/, '') || '/';
  if (path === '/' || path === '') return { name: 'overview' };
  if (/^\/jobs\/?$/.test(path)) return { name: 'jobs' };
  const m = /^\/jobs\/([^/]+)\/?$/.exec(path);
  if (m) {
    try {
      return { name: 'job', jid: decodeURIComponent(m[1]) };
    } catch { /* malformed escape: fall through */ }
  }
  return null;
}

function navigate() {
  const route = parseRoute(location.hash);
  if (!route) { location.replace('#/'); return; } // unknown route: go to the overview
  clearTimeout(app.timer);
  app.timer = null;
  app.generation += 1;
  app.route = route;
  app.view = { selected: null, terminalSeen: false, stopped: false, paused: false, busy: false,
    inFlight: false, queued: false, pendingDraw: false, data: undefined, message: null };
  document.body.dataset.ready = 'false';
  delete document.body.dataset.error;
  document.querySelectorAll('[data-nav]').forEach((a) => {
    const current = a.dataset.nav === route.name || (a.dataset.nav === 'jobs' && route.name === 'job');
    if (current) a.setAttribute('aria-current', 'page'); else a.removeAttribute('aria-current');
  });
  setBanner(null);
  $('#main').replaceChildren(el('p', { class: 'loading' }, 'Loading…'));
  render();
}

/** Loads and draws the current route; on completion marks the page ready and schedules a poll. */
async function render() {
  const { view, route, generation } = app;
  if (view.inFlight) { view.queued = true; return; }
  view.inFlight = true;
  let data;
  let error = null;
  const began = performance.now();
  try {
    data = await VIEWS[route.name].load(route, view);
  } catch (err) {
    error = err;
  }
  view.inFlight = false;
  view.lastLoadMs = performance.now() - began;
  if (generation !== app.generation) return; // the user navigated away meanwhile

  VIEWS[route.name].afterLoad?.(data, error, view);
  if (error) {
    showLoadError(route, view, error);
  } else {
    view.data = data;
    setBanner(null);
    delete document.body.dataset.error;
    drawView();
  }
  if (view.queued) {
    view.queued = false;
    render();
  } else {
    schedulePoll();
  }
}

/**
 * Draws the current view from its last data into <main>, keeping keyboard focus where it was,
 * then marks the render complete (body data-route / data-ready, renders + 1). While the user is
 * pressing a mouse button or has text selected in <main>, the draw is held back (see below).
 */
function drawView() {
  const { route, view } = app;
  if (view.data === undefined) return;
  if (userIsBusy()) {
    view.pendingDraw = true;
    updatePollStatus();
    return;
  }
  view.pendingDraw = false;
  const main = $('#main');
  const focusKey = focusSelector(document.activeElement);
  const kept = keptState(main);
  main.replaceChildren(VIEWS[route.name].draw(view.data, view));
  restoreState(main, kept);
  document.title = `${VIEWS[route.name].title(view.data)} · funke`;
  if (focusKey) document.querySelector(focusKey)?.focus({ preventScroll: true });
  markRendered();
}

// State the browser keeps inside elements — scroll offsets of the wide DAG, the timeline and
// tracebacks, and open <details> — is carried over to the redrawn tree by position.
const SCROLLERS = '.dag-scroll, .timeline-scroll, pre';

function keptState(root) {
  return {
    scroll: [...root.querySelectorAll(SCROLLERS)].map((e) => [e.scrollLeft, e.scrollTop]),
    open: [...root.querySelectorAll('details')].map((e) => e.open),
  };
}

function restoreState(root, kept) {
  root.querySelectorAll(SCROLLERS).forEach((e, i) => {
    if (kept.scroll[i]) [e.scrollLeft, e.scrollTop] = kept.scroll[i];
  });
  root.querySelectorAll('details').forEach((e, i) => { if (kept.open[i]) e.open = true; });
}

function markRendered() {
  document.body.dataset.route = app.route.name;
  document.body.dataset.ready = 'true';
  dashboard.renders += 1;
  updatePollStatus();
}

/** Redraw after a UI interaction (no fetch). */
const redraw = () => drawView();

// Replacing the DOM between mousedown and mouseup loses the click, and replacing selected text
// drops the selection. So a poll's draw waits until the button is up (and the click dispatched)
// and no text is selected in <main>.
let pointerDown = false;

function selectionInMain() {
  const sel = document.getSelection();
  return !!sel && !sel.isCollapsed && sel.rangeCount > 0 && $('#main').contains(sel.getRangeAt(0).commonAncestorContainer);
}

const userIsBusy = () => pointerDown || selectionInMain();

function drawIfPending() {
  if (app.view?.pendingDraw && !userIsBusy()) drawView();
}

document.addEventListener('pointerdown', () => { pointerDown = true; }, true);
for (const type of ['pointerup', 'pointercancel']) {
  document.addEventListener(type, () => {
    pointerDown = false;
    setTimeout(drawIfPending, 0); // after the click event of this same press
  }, true);
}
document.addEventListener('selectionchange', drawIfPending);

function focusSelector(node) {
  if (!node || node === document.body || !$('#main').contains(node)) return null;
  if (node.id) return `#${CSS.escape(node.id)}`;
  if (node.dataset?.vertexId) return `[data-vertex-id="${CSS.escape(node.dataset.vertexId)}"]`;
  if (node.dataset?.pickVertex !== undefined) return `[data-pick-vertex="${CSS.escape(node.dataset.pickVertex)}"]`;
  const row = node.closest('tr[data-vertex]');
  if (row) return `tr[data-vertex="${CSS.escape(row.dataset.vertex)}"] button`;
  return null;
}

function showLoadError(route, view, error) {
  const notFound = error.status === 404;
  document.body.dataset.error = notFound ? 'not-found' : error.status === 0 ? 'network' : 'error';
  if (view.data !== undefined && !notFound) {
    // Keep showing the last good data; say that it is stale.
    setBanner(`Could not refresh: ${error.message} Retrying…`);
    markRendered();
    return;
  }
  const message = notFound && route.name === 'job'
    ? `Job ${route.jid} was not found. It may have finished long ago and been removed, or the id is wrong.`
    : error.message;
  view.data = undefined;
  view.pendingDraw = false;
  document.title = 'Error · funke';
  $('#main').replaceChildren(el('div', { class: 'page' },
    el('div', { id: 'error', class: 'error-panel', role: 'alert' },
      el('p', {}, message),
      notFound ? el('p', {}, el('a', { href: '#/jobs' }, 'Back to the job list')) : el('p', {}, 'Retrying…'))));
  markRendered();
}

function setBanner(text) {
  const banner = $('#banner');
  banner.textContent = text || '';
  banner.hidden = !text;
}

function refreshInterval() {
  const ms = Number(dashboard.config?.['refresh-interval']);
  return Number.isFinite(ms) && ms >= 200 ? ms : 1000;
}

function schedulePoll() {
  clearTimeout(app.timer);
  app.timer = null;
  const { view } = app;
  updatePollStatus();
  if (view.stopped) return;
  if (document.hidden) { view.paused = true; return; }
  // A large job takes the JobManager a while to describe: wait at least three times as long
  // as the last load took, so one open page never keeps the JobManager's loop busy.
  app.timer = setTimeout(() => {
    app.timer = null;
    if (document.hidden) { view.paused = true; updatePollStatus(); return; }
    render();
  }, Math.max(refreshInterval(), 3 * (view.lastLoadMs || 0)));
}

/** Refresh at once (after an action), e.g. window.funkeDashboard.refresh() from a test. */
function refreshNow() {
  if (!app.view) return;
  clearTimeout(app.timer);
  app.timer = null;
  render();
}

function updatePollStatus() {
  const { view } = app;
  const status = $('#poll-status');
  const [mode, text] = view.pendingDraw ? ['held', 'Updates held while text is selected']
    : view.stopped ? ['stopped', 'Updates stopped']
      : view.paused ? ['paused', 'Paused'] : ['live', `Live · every ${formatDuration(refreshInterval())}`];
  status.textContent = text;
  status.dataset.polling = mode;
}

document.addEventListener('visibilitychange', () => {
  const { view } = app;
  if (!document.hidden && view?.paused && !view.stopped) {
    view.paused = false;
    render();
  }
});

// === Start-up ====================================================================================

async function start() {
  try {
    dashboard.config = await api('/config');
  } catch (err) {
    dashboard.config = {}; // defaults; the route's own fetches will show what is wrong
  }
  timeParts = makeTimeFormatter(dashboard.config);
  $('#version').textContent = [dashboard.config['flink-version'], timeZoneLabel && `times in ${timeZoneLabel}`]
    .filter(Boolean).join(' · ');
  window.addEventListener('hashchange', navigate);
  navigate();
}

start();
