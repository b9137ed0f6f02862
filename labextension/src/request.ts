import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import type { IState } from './types';
import { say } from './words';

/** An error from the /api/gpushare/ endpoints, with the server's message. */
export class GpuShareError extends Error {
  constructor(
    message: string,
    readonly status: number | null,
    /** The rule that refused (the server's code), if one did. */
    readonly code: string | null = null
  ) {
    super(message);
  }
}

/** A request to the server; a network failure is a GpuShareError that says so. */
async function send(
  url: string,
  init: RequestInit,
  settings: ServerConnection.ISettings
): Promise<{ response: Response; data: any }> {
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    throw new GpuShareError(
      say('ui.error.unreachable', {
        message: (error as Error).message ?? String(error)
      }),
      null
    );
  }
  const text = await response.text();
  let data: any = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null;
  }
  return { response, data };
}

/**
 * The server's refusal, worded: the rule that refused (its code and figures,
 * words.ts's policy.<code>), else the server's message.
 */
function failure(response: Response, data: any): GpuShareError {
  const message =
    (data && (data.message || data.reason)) ||
    `${response.status} ${response.statusText}`;
  const worded =
    data && typeof data.code === 'string'
      ? say(`policy.${data.code}`, { ...(data.params ?? {}), message })
      : message;
  return new GpuShareError(
    worded,
    response.status,
    data && typeof data.code === 'string' ? data.code : null
  );
}

/**
 * Call the jupyter-gpushare REST API (token, XSRF and base URL through
 * ServerConnection.makeRequest). Rejects with GpuShareError.
 */
export async function requestAPI<T>(
  endPoint: string,
  settings: ServerConnection.ISettings,
  init: RequestInit = {}
): Promise<T> {
  const url = URLExt.join(settings.baseUrl, 'api', 'gpushare', endPoint);
  const { response, data } = await send(url, init, settings);
  if (!response.ok) {
    throw failure(response, data);
  }
  return data as T;
}

/**
 * GET /api/gpushare/state, sending the version held (If-None-Match): an unchanged state comes back as a 304
 * with no body, and the one held is returned.
 */
export async function requestState(
  settings: ServerConnection.ISettings,
  held: IState | null
): Promise<IState> {
  const url = URLExt.join(settings.baseUrl, 'api', 'gpushare', 'state');
  const headers: Record<string, string> = held
    ? { 'If-None-Match': `"${held.version}"` }
    : {};
  const { response, data } = await send(
    url,
    { headers, cache: 'no-store' },
    settings
  );
  if (response.status === 304 && held) {
    return held;
  }
  if (!response.ok || !data) {
    throw failure(response, data);
  }
  return data as IState;
}
