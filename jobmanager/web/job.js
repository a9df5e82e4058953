/* View: one job ("#/jobs/<jid>"): its header and actions (cancel, stop), then the sections
 * drawn by dag.js, vertices.js, streaming.js, timeline.js and exceptions.js. */

import { NOT_CANCELLABLE, TERMINAL_JOB_STATES } from './palette.js';
import { el, enc } from './dom.js';
import { formatDuration, formatTime, isTime } from './format.js';
import { api, settle } from './api.js';
import { badge, definitionList } from './widgets.js';
import { app, dashboard, redraw, refreshNow } from './router.js';
import { dagSection } from './dag.js';
import { operatorsSection, subtasksSection, verticesSection } from './vertices.js';
import { timelineSection } from './timeline.js';
import { exceptionsSection } from './exceptions.js';
import { streamingSection } from './streaming.js';

export const jobView = {
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
