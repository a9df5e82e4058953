/* funke dashboard — a dependency-free single-page app served by the JobManager.
 *
 * Routes (location.hash):  "#/" cluster overview,  "#/jobs" job list,  "#/jobs/<jid>" one job.
 * Each route is a view with load() (fetches JSON) and draw() (builds a DOM tree from it). The
 * router runs load + draw, swaps the tree into <main>, then polls again after the configured
 * refresh interval while the page is visible.
 *
 * This file starts it. The page loads it as an ES module and the browser loads what it imports
 * (no build step; the JobManager serves every .js file of this directory):
 *
 *   router.js      routes, loading and drawing a view, polling, start-up; the public hooks
 *   overview.js    view "#/": the cluster overview
 *   jobs.js        view "#/jobs": the job list
 *   job.js         view "#/jobs/<jid>": one job's header and actions, and its sections:
 *     dag.js         the job graph (layout and SVG)
 *     vertices.js    the vertex, operator and subtask tables
 *     streaming.js   a streaming query's charts
 *     timeline.js    the attempts' timeline
 *     exceptions.js  the failure and the exception history
 *   widgets.js     badges, task bars, legends, cards, tables
 *   api.js         REST access and the login form
 *   format.js      times, durations, counts, bytes
 *   dom.js         building elements (text as text nodes)
 *   palette.js     the colour of each state, the sets of states
 *
 * Safety: text from the API only ever reaches the DOM via text nodes and setAttribute — there is
 * no innerHTML anywhere in these files.
 */

import { dashboard, start } from './router.js';
import { overviewView } from './overview.js';
import { jobsView } from './jobs.js';
import { jobView } from './job.js';
import { layoutDag } from './dag.js';

// === Public hooks (used by tests and handy from the console) =====================================

dashboard.layoutDag = (nodes) => layoutDag(nodes);
window.funkeDashboard = dashboard;

start({ overview: overviewView, jobs: jobsView, job: jobView });
