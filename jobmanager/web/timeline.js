/* The job page's timeline (a Gantt chart): each attempt's states over time. */

import { colourOf, STATE_ORDER, TERMINAL_TASK_STATES } from './palette.js';
import { el, svg } from './dom.js';
import { formatClock, formatDuration, formatTime, isTime } from './format.js';
import { errorPanel, legend, section } from './widgets.js';

const TIMELINE = { labelW: 260, plotW: 860, rowH: 20, axisH: 26, pad: 12 };

/** "Nice" tick step (ms) so that [t0, t1] gets at most ~maxTicks ticks. */
function tickStep(span, maxTicks) {
  const steps = [100, 200, 500, 1e3, 2e3, 5e3, 1e4, 15e3, 3e4, 6e4, 12e4, 3e5, 6e5, 9e5, 18e5,
    36e5, 72e5, 108e5, 216e5, 432e5, 864e5];
  return steps.find((s) => span / s <= maxTicks) || Math.ceil(span / maxTicks / 864e5) * 864e5;
}

export function timelineSection(job, times) {
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
