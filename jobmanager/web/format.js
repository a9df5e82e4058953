/* Formatting of times (in the cluster's time zone, see useTimeZone), durations, counts and bytes. */

export const isTime = (ms) => typeof ms === 'number' && Number.isFinite(ms) && ms > 0;
/** Epoch ms from a number or an ISO string (Spark's progress records use ISO timestamps). */
export const toMs = (t) => (typeof t === 'string' ? Date.parse(t) : t);
const numberFormat = new Intl.NumberFormat('en', { maximumFractionDigits: 1 });
const compactFormat = new Intl.NumberFormat('en', { notation: 'compact', maximumFractionDigits: 1 });
let timeZoneLabel = '';
let timeParts = makeTimeFormatter(null);

/** Formats times from now on as the cluster's /config says; returns the zone's label ('' if local). */
export function useTimeZone(config) {
  timeParts = makeTimeFormatter(config);
  return timeZoneLabel;
}

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

export function formatTime(ms) {
  if (!isTime(ms)) return '–';
  const p = timeParts(ms);
  return `${p.year}-${p.month}-${p.day} ${p.hour}:${p.minute}:${p.second}`;
}

export function formatClock(ms, withMillis) {
  const p = timeParts(ms);
  const base = `${p.hour}:${p.minute}:${p.second}`;
  return withMillis ? `${base}.${String(Math.floor(ms % 1000)).padStart(3, '0')}` : base;
}

export function formatDuration(ms) {
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

export const formatNumber = (n) => (typeof n === 'number' && Number.isFinite(n) ? numberFormat.format(n) : '–');
export const formatCompact = (n) => (typeof n === 'number' && Number.isFinite(n) ? compactFormat.format(n) : '–');
export function formatBytes(n) {
  if (typeof n !== 'number' || !Number.isFinite(n) || n < 0) return '–';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}
