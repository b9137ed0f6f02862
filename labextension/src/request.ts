import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import type { IState } from './types';

/** An error from the /api/gpushare/ endpoints, with the server's message. */
export class GpuShareError extends Error {
  constructor(
    message: string,
    readonly status: number | null
  ) {
    super(message);
  }
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
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    throw new GpuShareError(
      `The Jupyter server cannot be reached (${(error as Error).message ?? error}).`,
      null
    );
  }
  const text = await response.text();
  let data: any = null;
  if (text.length > 0) {
    try {
      data = JSON.parse(text);
    } catch {
      data = null;
    }
  }
  if (!response.ok) {
    const message =
      (data && (data.message || data.reason)) ||
      `${response.status} ${response.statusText}`;
    throw new GpuShareError(message, response.status);
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
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(
      url,
      { headers, cache: 'no-store' },
      settings
    );
  } catch (error) {
    throw new GpuShareError(
      `The Jupyter server cannot be reached (${(error as Error).message ?? error}).`,
      null
    );
  }
  if (response.status === 304 && held) {
    return held;
  }
  const text = await response.text();
  let data: any = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null;
  }
  if (!response.ok || !data) {
    const message =
      (data && (data.message || data.reason)) ||
      `${response.status} ${response.statusText}`;
    throw new GpuShareError(message, response.status);
  }
  return data as IState;
}
