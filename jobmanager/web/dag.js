/* The job page's graph: the plan's DAG laid out in layers and drawn in SVG; clicking a vertex
 * selects it (the vertex and subtask sections then show only it). */

import { colourOf, STATE_ORDER, textColourOn } from './palette.js';
import { el, svg } from './dom.js';
import { legend, section } from './widgets.js';
import { redraw } from './router.js';

/**
 * Layered layout of the plan's DAG (a small Sugiyama). Layer of a node = longest path from a
 * source. An edge spanning several layers gets a virtual node in each layer it crosses, so it is
 * routed around real nodes. Within a layer, alternating sweeps sort nodes by the barycenter of
 * their neighbours above (going down) or below (going up), which removes most crossings.
 * Returns {layers: [[id, ...]], virtual: Set of virtual ids, edges: [{from, to, input, chain}]}
 * where chain lists the ids an edge passes through, from its source to its target.
 */
export function layoutDag(nodes) {
  const ids = new Set(nodes.map((n) => n.id));
  const parents = new Map(nodes.map((n) => [n.id, []]));
  const edges = [];
  for (const node of nodes) {
    for (const input of node.inputs || []) {
      if (!ids.has(input.id)) continue;
      edges.push({ from: input.id, to: node.id, input });
      parents.get(node.id).push(input.id);
    }
  }
  const layerOf = new Map();
  const visiting = new Set();
  const depth = (id) => {
    if (layerOf.has(id)) return layerOf.get(id);
    if (visiting.has(id)) return 0; // a cycle (should not happen): break it here
    visiting.add(id);
    const d = Math.max(-1, ...parents.get(id).map(depth)) + 1;
    visiting.delete(id);
    layerOf.set(id, d);
    return d;
  };
  nodes.forEach((n) => depth(n.id));

  const layers = [];
  for (const n of nodes) (layers[layerOf.get(n.id)] ||= []).push(n.id);
  // Split long edges into chains through virtual nodes; record neighbours along the chains.
  const virtual = new Set();
  const up = new Map([...ids].map((id) => [id, []]));
  const down = new Map([...ids].map((id) => [id, []]));
  edges.forEach((edge, e) => {
    edge.chain = [edge.from];
    for (let l = layerOf.get(edge.from) + 1; l < layerOf.get(edge.to); l += 1) {
      const v = `\u0000${e}:${l}`;
      virtual.add(v);
      layers[l].push(v);
      up.set(v, []);
      down.set(v, []);
      edge.chain.push(v);
    }
    edge.chain.push(edge.to);
    for (let k = 1; k < edge.chain.length; k += 1) {
      up.get(edge.chain[k]).push(edge.chain[k - 1]);
      down.get(edge.chain[k - 1]).push(edge.chain[k]);
    }
  });
  // Position = index centred around 0, so layers of different sizes line up in the middle.
  const pos = new Map();
  const place = (layer) => layer.forEach((id, i) => pos.set(id, i - (layer.length - 1) / 2));
  layers.forEach(place);
  const barycenter = (id, neighbours) => {
    const ns = neighbours.get(id);
    return ns.length ? ns.reduce((s, n) => s + pos.get(n), 0) / ns.length : pos.get(id);
  };
  for (let sweep = 0; sweep < 4; sweep += 1) {
    const goingDown = sweep % 2 === 0;
    const order = goingDown ? layers.slice(1) : layers.slice(0, -1).reverse();
    for (const layer of order) {
      const key = new Map(layer.map((id) => [id, barycenter(id, goingDown ? up : down)]));
      layer.sort((a, b) => key.get(a) - key.get(b) || pos.get(a) - pos.get(b)); // stable
      place(layer);
    }
  }
  return { layers, virtual, edges };
}

/** Greedy word wrap for SVG text (which cannot wrap by itself); ellipsis after maxLines. */
function wrapText(text, maxChars, maxLines) {
  const words = String(text).split(/\s+/).filter(Boolean)
    .flatMap((w) => (w.length > maxChars ? w.match(new RegExp(`.{1,${maxChars}}`, 'g')) : [w]));
  const lines = [];
  for (const word of words) {
    const last = lines[lines.length - 1];
    if (last !== undefined && `${last} ${word}`.length <= maxChars) lines[lines.length - 1] = `${last} ${word}`;
    else lines.push(word);
  }
  if (lines.length > maxLines) {
    lines.length = maxLines;
    lines[maxLines - 1] = `${lines[maxLines - 1].slice(0, maxChars - 1)}…`;
  }
  return lines.length ? lines : [''];
}

const DAG = { nodeW: 232, nodeH: 96, virtualH: 14, gapX: 130, gapY: 30, margin: 16 };

export function dagSection(job, view) {
  const nodes = job.plan?.nodes || [];
  const vertices = new Map((job.vertices || []).map((v) => [v.id, v]));
  if (!nodes.length) return section('job-graph', 'Job graph', el('p', { class: 'empty' }, 'No plan available.'));
  const present = new Set(nodes.map((n) => vertices.get(n.id)?.status || 'CREATED'));
  return section('job-graph', 'Job graph',
    el('div', { class: 'dag-scroll' }, drawDag(nodes, vertices, view)),
    legend(STATE_ORDER.filter((s) => present.has(s))),
    el('p', { class: 'hint' }, 'Click a vertex to show only its subtasks. Dashed edges are blocking exchanges.'));
}

function drawDag(nodes, vertices, view) {
  const { nodeW, nodeH, virtualH, gapX, gapY, margin } = DAG;
  const { layers, virtual, edges } = layoutDag(nodes);
  const heightOf = (id) => (virtual.has(id) ? virtualH : nodeH);
  const layerH = layers.map((l) => l.reduce((s, id) => s + heightOf(id), 0) + (l.length - 1) * gapY);
  const tallest = Math.max(...layerH);
  const box = new Map(); // id -> {x, y, h}
  layers.forEach((layer, li) => {
    let y = margin + (tallest - layerH[li]) / 2;
    for (const id of layer) {
      box.set(id, { x: margin + li * (nodeW + gapX), y, h: heightOf(id) });
      y += heightOf(id) + gapY;
    }
  });
  const ports = edgePorts(edges, box);
  const width = margin * 2 + layers.length * nodeW + (layers.length - 1) * gapX;
  const height = margin * 2 + tallest;
  const byId = new Map(nodes.map((n) => [n.id, n]));
  return svg('svg', { id: 'job-graph-svg', class: 'dag', width, height, viewBox: `0 0 ${width} ${height}`,
    role: 'group', 'aria-label': 'Job graph' },
  svg('defs', {}, svg('marker', { id: 'dag-arrow', viewBox: '0 0 10 10', refX: 10, refY: 5,
    markerWidth: 8, markerHeight: 8, orient: 'auto-start-reverse' },
  svg('path', { d: 'M0,0 L10,5 L0,10 z', class: 'dag-arrowhead' }))),
  edges.map((e, i) => drawEdge(e, box, ports[i])),
  nodes.map((n) => drawNode(n, vertices.get(n.id), box.get(n.id), view)));
}

/**
 * Spreads the edges leaving (and entering) a node along its right (left) side, ordered by where
 * their other end is, so parallel edges neither overlap nor cross at the node.
 * Returns per edge {out: y at the source, in: y at the target}.
 */
function edgePorts(edges, box) {
  const ports = edges.map(() => ({}));
  const centre = (id) => box.get(id).y + box.get(id).h / 2;
  const assign = (key, side, neighbour) => {
    const groups = new Map();
    edges.forEach((e, i) => {
      const id = side === 'out' ? e.chain[0] : e.chain[e.chain.length - 1];
      if (!groups.has(id)) groups.set(id, []);
      groups.get(id).push(i);
    });
    for (const [id, list] of groups) {
      list.sort((a, b) => centre(neighbour(edges[a])) - centre(neighbour(edges[b])) || a - b);
      const b = box.get(id);
      list.forEach((i, k) => { ports[i][key] = b.y + (b.h * (k + 1)) / (list.length + 1); });
    }
  };
  assign('out', 'out', (e) => e.chain[1]);
  assign('in', 'in', (e) => e.chain[e.chain.length - 2]);
  return ports;
}

/** An edge as smooth curves through its virtual nodes, labelled in the gap before its target. */
function drawEdge(edge, box, port) {
  const { nodeW, gapX } = DAG;
  const { chain } = edge;
  const curve = (x1, y1, x2, y2) => {
    const dx = Math.max(30, (x2 - x1) / 2);
    return [x1, y1, x1 + dx, y1, x2 - dx, y2, x2, y2];
  };
  let x = box.get(chain[0]).x + nodeW;
  let y = port.out;
  let d = `M${x},${y}`;
  let last = null;
  for (let k = 1; k < chain.length; k += 1) {
    const b = box.get(chain[k]);
    const ty = k === chain.length - 1 ? port.in : b.y + b.h / 2;
    last = curve(x, y, b.x, ty);
    d += ` C${last[2]},${last[3]} ${last[4]},${last[5]} ${last[6]},${last[7]}`;
    x = b.x + nodeW;
    y = ty;
    if (k < chain.length - 1) d += ` L${x},${y}`; // straight through a virtual node's column
  }
  const point = bezierAtX(last, last[6] - gapX / 2);
  const ship = edge.input.ship_strategy || '';
  const pattern = edge.input['distribution-pattern'] || '';
  const exchange = edge.input.exchange || '';
  const labelW = Math.max(ship.length, pattern.length) * 6.6 + 10;
  return svg('g', { class: `dag-edge${exchange === 'blocking' ? ' blocking' : ''}`,
    'data-source': edge.from, 'data-target': edge.to },
  svg('title', {}, `${edge.from} → ${edge.to}: ${[ship, pattern, exchange].filter(Boolean).join(', ')}`),
  svg('path', { d, class: 'dag-edge-line', 'marker-end': 'url(#dag-arrow)' }),
  svg('rect', { class: 'dag-edge-label-bg', x: point.x - labelW / 2, y: point.y - 13, width: labelW,
    height: 26, rx: 4 }),
  svg('text', { class: 'dag-edge-label', x: point.x, y: point.y - 2, 'text-anchor': 'middle' }, ship),
  svg('text', { class: 'dag-edge-sublabel', x: point.x, y: point.y + 9, 'text-anchor': 'middle' }, pattern));
}

/** Point of a cubic Bézier [x0,y0,cx1,cy1,cx2,cy2,x1,y1] (x monotonic here) at x, by bisection. */
function bezierAtX(c, x) {
  const at = (t, i) => {
    const u = 1 - t;
    return u * u * u * c[i] + 3 * u * u * t * c[i + 2] + 3 * u * t * t * c[i + 4] + t * t * t * c[i + 6];
  };
  let lo = 0; let hi = 1;
  for (let k = 0; k < 30; k += 1) {
    const mid = (lo + hi) / 2;
    if (at(mid, 0) < x) lo = mid; else hi = mid;
  }
  return { x: at(lo, 0), y: at(lo, 1) };
}

function drawNode(node, vertex, b, view) {
  const { nodeW, nodeH } = DAG;
  const status = vertex?.status || 'CREATED';
  const fill = colourOf(status);
  const ink = textColourOn(fill);
  const name = vertex?.name || node.description || node.id;
  const selected = view.selected === node.id;
  const lines = wrapText(name, 26, 2);
  const counts = Object.entries(vertex?.tasks || {}).filter(([, n]) => n > 0)
    .sort(([a], [c]) => STATE_ORDER.indexOf(a) - STATE_ORDER.indexOf(c));
  // Chips "2 running  1 finished"; just the numbers when the names do not fit.
  const named = counts.reduce((len, [s, n]) => len + `${n} ${s}`.length + 3, 0) <= 30;
  const select = () => selectVertex(view, selected ? null : node.id);
  let chipX = b.x + 10;
  return svg('g', {
    class: `dag-node${selected ? ' selected' : ''}`, 'data-vertex-id': node.id, 'data-state': status,
    fill, tabindex: 0, role: 'button', 'aria-pressed': String(selected),
    'aria-label': `${name}, ${status}, parallelism ${node.parallelism}`,
    onclick: select,
    onkeydown: (ev) => { if (ev.key === 'Enter' || ev.key === ' ') { ev.preventDefault(); select(); } },
  },
  svg('title', {}, `${name}\n${status} · parallelism ${node.parallelism}`),
  svg('rect', { class: 'dag-node-box', x: b.x, y: b.y, width: nodeW, height: nodeH, rx: 6, fill }),
  lines.map((line, i) => svg('text', { class: 'dag-node-name', x: b.x + 10, y: b.y + 21 + i * 16, fill: ink }, line)),
  svg('text', { class: 'dag-node-meta', x: b.x + 10, y: b.y + 62, fill: ink },
    `Parallelism: ${node.parallelism ?? vertex?.parallelism ?? '?'}`),
  counts.map(([state, n]) => {
    const label = named ? `${n} ${state.toLowerCase()}` : String(n);
    const chip = svg('g', { class: 'dag-node-count', 'data-count-state': state },
      svg('title', {}, `${state}: ${n}`),
      svg('rect', { x: chipX, y: b.y + nodeH - 22, width: 10, height: 10, rx: 2,
        fill: colourOf(state), class: 'dag-chip' }),
      svg('text', { x: chipX + 14, y: b.y + nodeH - 13, fill: ink, class: 'dag-chip-label' }, label));
    chipX += 26 + label.length * 6.5;
    return chip;
  }));
}

export function selectVertex(view, vid) {
  view.selected = vid;
  redraw();
}
