/* The job page's vertex, operator and subtask tables, with their records and bytes in and out. */

import { el } from './dom.js';
import { formatBytes, formatDuration, formatTime } from './format.js';
import { badge, countCell, errorPanel, section, table, taskBar } from './widgets.js';
import { selectVertex } from './dag.js';

export function verticesSection(job, view) {
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
export function operatorsSection(job, view) {
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

export function subtasksSection(job, details, view) {
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
