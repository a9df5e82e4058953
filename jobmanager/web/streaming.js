/* The job page's streaming query section: charts of its micro-batches' rates, durations and
 * keyed state, and its latest progress record. */

import { el, svg } from './dom.js';
import { formatCompact, formatNumber, formatTime, toMs } from './format.js';
import { errorPanel, section } from './widgets.js';

const CHART = { w: 360, h: 170, left: 52, right: 14, top: 12, bottom: 30 };

export function streamingSection(job, batches) {
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
    lagTable(progress),
    progress ? el('details', { class: 'progress' }, el('summary', {}, 'Latest progress record'),
      el('pre', { class: 'progress-json' }, JSON.stringify(progress, null, 2))) : null);
}

/** A broker source's consumer lag after the latest batch, per partition (Kafka: lag {topic:
 * {partition: n}}) or stream key (Redis: lag {key: n}), flattened as
 * funke.common.streaming.progress.source_lags does for the metrics. */
function lagTable(progress) {
  const rows = [];
  for (const source of progress?.sources || []) {
    if (!source.lag || typeof source.lag !== 'object') continue;
    for (const [stream, value] of Object.entries(source.lag)) {
      if (value && typeof value === 'object') {
        for (const [partition, n] of Object.entries(value)) rows.push([source.description, `${stream} / ${partition}`, n]);
      } else if (typeof value === 'number') {
        rows.push([source.description, stream, value]);
      }
    }
  }
  if (!rows.length) return null;
  return el('table', { class: 'source-lag', id: 'source-lag' },
    el('thead', {}, el('tr', {}, el('th', {}, 'Source'), el('th', {}, 'Partition'), el('th', {}, 'Lag (records)'))),
    el('tbody', {}, ...rows.map(([source, where, n]) => el('tr', {},
      el('td', {}, source), el('td', {}, where), el('td', {}, formatNumber(n))))));
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
