/* Small widgets every view draws with: state badges, task bars, legends, cards, tables. */

import { colourOf, STATE_ORDER, textColourOn } from './palette.js';
import { el } from './dom.js';
import { formatCompact, formatNumber } from './format.js';

export function badge(state) {
  const colour = colourOf(state);
  return el('span', { class: 'badge', style: { background: colour, color: textColourOn(colour) } },
    state || 'UNKNOWN');
}

/** A horizontal bar of task counts by state; counts: {STATE: n} (any case). */
export function taskBar(counts) {
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

export function legend(states) {
  return el('ul', { class: 'legend', 'aria-label': 'State colours' },
    states.map((s) => el('li', {}, el('span', { class: 'swatch', style: { background: colourOf(s) } }), s)));
}

export function section(id, title, ...body) {
  return el('section', { id, class: 'card', 'aria-labelledby': `${id}-title` },
    el('h2', { id: `${id}-title` }, title), ...body);
}

export function errorPanel(message) {
  return el('p', { class: 'error-panel', role: 'alert' }, message);
}

export function definitionList(pairs) {
  return el('dl', { class: 'facts' },
    pairs.filter(Boolean).map(([k, v]) => [el('dt', {}, k), el('dd', {}, v)]));
}

export function table(headers, rows, attrs = {}) {
  return el('table', { class: 'grid', ...attrs },
    el('thead', {}, el('tr', {}, headers.map((h) => el('th', { scope: 'col' }, h)))),
    el('tbody', {}, rows));
}
/** A count's table cell: compact, the exact number in its title and data-value ('' and '–': not measured). */
export function countCell(n, attrs = {}) {
  const known = typeof n === 'number' && Number.isFinite(n);
  return el('td', { class: 'num', 'data-value': known ? String(n) : '', title: known ? formatNumber(n) : 'not measured',
    ...attrs }, formatCompact(n));
}
