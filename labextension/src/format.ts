/**
 * Size formatting and parsing. Pure functions (no JupyterLab imports) so that
 * they run under node's test runner.
 */

const UNITS: { [unit: string]: number } = {
  '': 1,
  b: 1 / 1048576,
  k: 1 / 1024,
  kb: 1 / 1024,
  kib: 1 / 1024,
  m: 1,
  mb: 1,
  mib: 1,
  g: 1024,
  gb: 1024,
  gib: 1024,
  t: 1024 * 1024,
  tb: 1024 * 1024,
  tib: 1024 * 1024
};

/** True when a figure is a finite number (the sampler's fields may be null or absent). */
export function isMeasured(value: number | null | undefined): value is number {
  return typeof value === 'number' && isFinite(value);
}

/** One decimal place, but no "-0.0". */
function fixed1(x: number): string {
  const s = x.toFixed(1);
  return s === '-0.0' ? '0.0' : s;
}

/**
 * A size in MiB for people: "512 MiB" below 1 GiB, else "1.5 GiB".
 * "–" when the size is unknown.
 */
export function formatMiB(mib: number | null | undefined): string {
  if (!isMeasured(mib)) {
    return '–';
  }
  if (Math.abs(mib) < 1024) {
    return `${Math.round(mib)} MiB`;
  }
  if (Math.abs(mib) < 1024 * 1024) {
    return `${fixed1(mib / 1024)} GiB`;
  }
  return `${fixed1(mib / 1024 / 1024)} TiB`;
}

/**
 * A size in GiB with one decimal place, whatever its size ("0.5 GiB", "2.5 GiB",
 * "80.0 GiB"): figures side by side in one unit. "–" when unknown.
 */
export function formatGiB(mib: number | null | undefined): string {
  return isMeasured(mib) ? `${fixed1(mib / 1024)} GiB` : '–';
}

/**
 * "used / total unit" with one unit chosen from the total, e.g. "1.2 / 4.0 GiB",
 * "– / 4.0 GiB" when use is not measured, "300 / 512 MiB" for small quotas.
 */
export function formatUsage(
  usedMiB: number | null | undefined,
  totalMiB: number | null | undefined
): string {
  if (!isMeasured(totalMiB)) {
    return `${isMeasured(usedMiB) ? formatMiB(usedMiB) : '–'} / –`;
  }
  const gib = totalMiB >= 1024;
  const num = (x: number): string =>
    gib ? fixed1(x / 1024) : String(Math.round(x));
  const used = isMeasured(usedMiB) ? num(usedMiB) : '–';
  return `${used} / ${num(totalMiB)} ${gib ? 'GiB' : 'MiB'}`;
}

/**
 * Parse a size such as "6GiB", "6 GiB", "512MiB", "4G", "1.5g" or "25%" into MiB.
 * A percentage needs the card's total. Returns null when the text is not a size.
 */
export function parseSize(text: string, cardTotalMiB?: number): number | null {
  const m = /^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z%]*)\s*$/.exec(text ?? '');
  if (!m) {
    return null;
  }
  const value = parseFloat(m[1]);
  const unit = m[2].toLowerCase();
  if (unit === '%') {
    if (!isMeasured(cardTotalMiB) || value > 100) {
      return null;
    }
    return Math.floor((cardTotalMiB * value) / 100);
  }
  if (!(unit in UNITS)) {
    return null;
  }
  return Math.round(value * UNITS[unit]);
}

/** A percentage for people: "34%"; "–" when unknown. */
export function formatPercent(value: number | null | undefined): string {
  return isMeasured(value) ? `${Math.round(value)}%` : '–';
}

/** Seconds for people: "45 s", "3 min", "2 h 5 min". */
export function formatDuration(seconds: number | null | undefined): string {
  if (!isMeasured(seconds)) {
    return '–';
  }
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) {
    return `${s} s`;
  }
  if (s < 3600) {
    return `${Math.floor(s / 60)} min`;
  }
  const h = Math.floor(s / 3600);
  const min = Math.floor((s % 3600) / 60);
  return min ? `${h} h ${min} min` : `${h} h`;
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
