/* View: the job list ("#/jobs"): running and completed jobs. */

import { TERMINAL_JOB_STATES } from './palette.js';
import { el, enc } from './dom.js';
import { formatDuration, formatTime } from './format.js';
import { api } from './api.js';
import { badge, section, table, taskBar } from './widgets.js';

export const jobsView = {
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
