/* View: the cluster overview ("#/"): slots, jobs by state, TaskManagers. */

import { STATE_ORDER } from './palette.js';
import { el } from './dom.js';
import { formatDuration, formatTime } from './format.js';
import { api } from './api.js';
import { badge, definitionList, section, table } from './widgets.js';

export const overviewView = {
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
