/* REST access: JSON from the JobManager, and the login form a 401 shows (the token is traded
 * for an HttpOnly cookie). */

import { $ } from './dom.js';

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status; // 0: network error
  }
}

/** Human-readable error from an {"errors": [...]} body, else the status line. */
async function errorMessage(resp) {
  try {
    const body = await resp.json();
    if (body && Array.isArray(body.errors) && body.errors.length) return body.errors.map(String).join('; ');
  } catch { /* not JSON */ }
  return `${resp.status} ${resp.statusText || 'error'}`;
}

/** Fetches JSON. A 401 shows the login form and retries once the user has signed in. */
export async function api(path, { method = 'GET', body } = {}) {
  for (;;) {
    let resp;
    try {
      resp = await fetch(path, {
        method,
        credentials: 'same-origin',
        cache: 'no-store',
        headers: body === undefined ? { Accept: 'application/json' }
          : { Accept: 'application/json', 'Content-Type': 'application/json' },
        body: body === undefined ? undefined : JSON.stringify(body),
      });
    } catch (err) {
      throw new ApiError(0, `Cannot reach the JobManager (${err.message}).`);
    }
    if (resp.status === 401) {
      await requestLogin(await errorMessage(resp));
      continue;
    }
    if (!resp.ok) throw new ApiError(resp.status, await errorMessage(resp));
    const text = await resp.text();
    if (!text) return {};
    try {
      return JSON.parse(text);
    } catch {
      throw new ApiError(resp.status, `The JobManager sent invalid JSON for ${path}.`);
    }
  }
}

/** The outcome of a promise without throwing: {value} or {error}. */
export const settle = (promise) => promise.then((value) => ({ value }), (error) => ({ error }));

let loginPromise = null;

/** Shows the token form (once, however many requests got a 401); resolves after a good login. */
function requestLogin(reason) {
  if (!loginPromise) {
    loginPromise = new Promise((resolve) => {
      showLoginForm(reason, () => { loginPromise = null; resolve(); });
    });
  }
  return loginPromise;
}

function showLoginForm(reason, done) {
  const backdrop = $('#login');
  const form = $('#login-form');
  const input = $('#login-token');
  const error = $('#login-error');
  const submit = $('#login-submit');
  error.textContent = reason && !/^401\b/.test(reason) ? reason : '';
  backdrop.hidden = false;
  document.body.dataset.login = 'required';
  input.value = '';
  input.focus();
  form.onsubmit = async (event) => {
    event.preventDefault();
    const token = input.value.trim();
    if (!token) { error.textContent = 'Please enter the token.'; return; }
    submit.disabled = true;
    try {
      // The token only travels in this request; the server answers with an HttpOnly cookie.
      const resp = await fetch('/login', {
        method: 'POST',
        credentials: 'same-origin',
        headers: { 'Content-Type': 'application/json' },
        body: JSON.stringify({ token }),
      });
      if (resp.ok) {
        input.value = '';
        form.onsubmit = null;
        backdrop.hidden = true;
        delete document.body.dataset.login;
        done();
        return;
      }
      error.textContent = resp.status === 401 ? 'That token was not accepted.' : await errorMessage(resp);
    } catch (err) {
      error.textContent = `Cannot reach the JobManager (${err.message}).`;
    } finally {
      submit.disabled = false;
    }
  };
}
