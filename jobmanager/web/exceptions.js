/* The job page's exceptions: the job's failure and the exception history, with tracebacks. */

import { el } from './dom.js';
import { formatTime } from './format.js';
import { definitionList, errorPanel, section } from './widgets.js';

export function exceptionsSection(job, exceptions) {
  const failure = job.failure;
  const body = [];
  const entries = exceptions.value?.exceptionHistory?.entries || [];
  if (failure) {
    const sameAsRoot = entries.length && entries[0].stacktrace === failure.traceback;
    body.push(el('article', { class: 'job-failure', id: 'job-failure' },
      el('h3', {}, 'Job failure: ', el('span', { class: 'exception-name' }, failure.exception || 'Error')),
      failure.message ? el('p', { class: 'exception-message' }, failure.message) : null,
      failure.traceback && !sameAsRoot ? el('pre', { class: 'exception' }, failure.traceback) : null));
  }
  if (exceptions.error) {
    body.push(errorPanel(exceptions.error.message));
  } else if (entries.length) {
    body.push(el('ol', { class: 'exception-list' }, entries.map((e, i) => exceptionEntry(e, i === 0))));
    if (exceptions.value.exceptionHistory.truncated) {
      body.push(el('p', { class: 'muted' }, 'Older exceptions were dropped from the history.'));
    }
  } else if (exceptions.value?.['root-exception']) {
    body.push(el('article', { class: 'exception-entry root' },
      el('h3', {}, 'Root exception', el('span', { class: 'muted' }, ` · ${formatTime(exceptions.value.timestamp)}`)),
      el('pre', { class: 'exception' }, exceptions.value['root-exception'])));
  } else if (!failure) {
    body.push(el('p', { class: 'empty' }, 'No exceptions.'));
  }
  return section('exceptions', 'Exceptions', body);
}

function exceptionEntry(entry, root) {
  const tm = [entry.taskManagerId, entry.location].filter(Boolean).join(' · ');
  return el('li', { class: `exception-entry${root ? ' root' : ''}` },
    el('div', { class: 'exception-head' },
      root ? el('span', { class: 'tag' }, 'root cause') : null,
      el('strong', { class: 'exception-name' }, entry.exceptionName || 'Exception'),
      el('span', {}, ` · ${formatTime(entry.timestamp)}`)),
    definitionList([
      ['Task', entry.taskName || '–'],
      ['TaskManager', tm || '–'],
    ]),
    el('pre', { class: 'exception' }, entry.stacktrace || '(no traceback)'));
}
