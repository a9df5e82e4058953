/* The router: location.hash to a view, loading and drawing it into <main>, and polling again
 * after the configured refresh interval while the page is visible. The views come from app.js
 * (start); they reach back only through app, dashboard, redraw and refreshNow. */

import { STATE_COLOURS } from './palette.js';
import { $, el } from './dom.js';
import { formatDuration, useTimeZone } from './format.js';
import { api } from './api.js';

/** The public hooks (window.funkeDashboard, set by app.js: used by tests and handy from the console). */
export const dashboard = {
  STATE_COLOURS,
  renders: 0,
  config: null,
  refresh: () => refreshNow(),
  layoutDag: null, // app.js: the DAG layout (dag.js), which the router does not draw itself
};

/** Route name -> view ({title, load, draw, afterLoad?}), given to start() by app.js. */
const VIEWS = {};

/** Route state. `view` is recreated on every navigation and holds per-page UI state. */
export const app = { route: null, view: null, generation: 0, timer: null };

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
export const redraw = () => drawView();

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
export function refreshNow() {
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

export async function start(views) {
  Object.assign(VIEWS, views);
  try {
    dashboard.config = await api('/config');
  } catch (err) {
    dashboard.config = {}; // defaults; the route's own fetches will show what is wrong
  }
  const timeZoneLabel = useTimeZone(dashboard.config);
  $('#version').textContent = [dashboard.config['flink-version'], timeZoneLabel && `times in ${timeZoneLabel}`]
    .filter(Boolean).join(' · ');
  window.addEventListener('hashchange', navigate);
  navigate();
}
