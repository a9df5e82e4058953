/* The colour of each Flink state (the DAG, badges, task bars and the timeline all use these)
 * and the sets of states the views test against. */

/** Colour per Flink state; DAG node rects use exactly these strings as their fill. */
export const STATE_COLOURS = Object.freeze({
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
export const STATE_ORDER = ['CREATED', 'SCHEDULED', 'DEPLOYING', 'INITIALIZING', 'RECONCILING', 'RUNNING',
  'FINISHED', 'CANCELING', 'CANCELLING', 'CANCELED', 'FAILING', 'FAILED', 'RESTARTING', 'SUSPENDED'];

/** Globally terminal job states: polling stops after one more refresh. */
export const TERMINAL_JOB_STATES = new Set(['FINISHED', 'FAILED', 'CANCELED']);
/** States in which cancelling makes no sense (SUSPENDED: this JobManager no longer runs it). */
export const NOT_CANCELLABLE = new Set([...TERMINAL_JOB_STATES, 'SUSPENDED', 'CANCELING', 'CANCELLING']);
/** Task states whose timeline segment ends where it starts (the attempt is over). */
export const TERMINAL_TASK_STATES = new Set(['FINISHED', 'FAILED', 'CANCELED']);

export const colourOf = (state) => STATE_COLOURS[state] || UNKNOWN_COLOUR;

/** Black or white text, whichever reads better on the given #rrggbb background. */
export function textColourOn(hex) {
  const m = /^#([0-9a-f]{2})([0-9a-f]{2})([0-9a-f]{2})$/i.exec(hex);
  if (!m) return '#1d232a';
  const [r, g, b] = m.slice(1).map((x) => parseInt(x, 16) / 255)
    .map((c) => (c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4));
  const luminance = 0.2126 * r + 0.7152 * g + 0.0722 * b;
  return luminance > 0.3 ? '#1d232a' : '#ffffff';
}
