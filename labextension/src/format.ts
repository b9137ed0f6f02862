/**
 * Figures and names for people. Sizes and times are worded in words.ts (one
 * formatter, the server's rules); a size typed by a person is parsed by the
 * server only. Pure functions (no JupyterLab imports) so that they run under
 * node's test runner.
 */

export { formatDuration, formatMiB, formatUsage, isMeasured } from './words';
import { isMeasured } from './words';

/** A percentage for people: "34%"; "–" when unknown. */
export function formatPercent(value: number | null | undefined): string {
  return isMeasured(value) ? `${Math.round(value)}%` : '–';
}

/**
 * What people call a card: the server's label ("GPU 0", or "GPU 0 MIG 3" for one
 * of several MIG instances of GPU 0), else "GPU <index>".
 */
export function cardLabel(card: { index: number; label?: string }): string {
  return card.label || `GPU ${card.index}`;
}

/** The file name of a notebook path ("a/b/c.ipynb" → "c.ipynb"). */
export function basename(path: string | null | undefined): string {
  if (!path) {
    return '';
  }
  const parts = path.split(/[\\/]/).filter(p => p.length > 0);
  return parts.length ? parts[parts.length - 1] : path;
}

/** JupyterLab 4 starts a notebook's session at a temporary path (a bare UUID), then renames it to the notebook's. */
const TEMPORARY =
  /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/** True for a session path that is not yet its notebook's (no name for people). */
export function isTemporaryPath(path: string | null | undefined): boolean {
  return !!path && TEMPORARY.test(basename(path));
}

/**
 * What a person calls a notebook among the others shown: its file name, or, where
 * another notebook has the same file name (a.ipynb and week2/a.ipynb), its path
 * relative to the server's root. "" for no path or a temporary one.
 */
export function notebookName(
  path: string | null | undefined,
  others: ReadonlyArray<string | null | undefined> = []
): string {
  if (!path || isTemporaryPath(path)) {
    return '';
  }
  const name = basename(path);
  const clash = others.some(
    o => !!o && o !== path && !isTemporaryPath(o) && basename(o) === name
  );
  return clash ? path.replace(/^[\\/]+/, '') : name;
}
