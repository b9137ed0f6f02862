import { Widget } from '@lumino/widgets';
import { h, VirtualDOM, VirtualElement } from '@lumino/virtualdom';

import { IKernelActions } from './actions';
import { bar, C, cardHead, notice } from './dom';
import {
  formatDuration,
  formatMiB,
  formatPercent,
  formatUsage,
  isMeasured
} from './format';
import { renderHostSection } from './hostpanel';
import { GpuShareModel, ISettings, ISnapshot } from './model';
import { historyText, quotaMiB, statusOf } from './state';
import { ICurrent, KernelTracker } from './tracker';
import type { ICard, IKernel } from './types';
import { say, sizeText } from './words';

/** What the panel shows: the server's state, the notebook in front, the user's settings. */
export interface IPanelView {
  snapshot: ISnapshot;
  current: ICurrent;
  /** The record of the notebook in front (by kernel id), if any. */
  currentKernel: IKernel | undefined;
  settings: ISettings;
  /** The "This host" section is open. */
  hostOpen: boolean;
}

function renderCard(card: ICard): VirtualElement {
  const segs = card.segments ?? [];
  const measured = isMeasured(card.used_mib);
  return h.div(
    {
      className: `${C}-card${card.allowed ? '' : ` ${C}-card-disallowed`}`,
      dataset: { uuid: card.uuid }
    },
    cardHead(card, formatMiB(card.total_mib)),
    bar(
      segs.map(s => ({ cls: s.key, mib: s.mib, title: s.title })),
      card.total_mib,
      undefined,
      `${card.label ?? `GPU ${card.index}`}, ${formatMiB(card.total_mib)}: ` +
        segs
          .filter(s => s.mib > 0)
          .map(s => `${s.label} ${formatMiB(s.mib)}`)
          .join(', ')
    ),
    h.div(
      { className: `${C}-legend` },
      ...segs
        .filter(s => s.mib > 0 || s.key === 'mine' || s.key === 'free')
        .map(s =>
          h.span(
            {
              className: `${C}-legend-item`,
              title: s.title,
              dataset: { key: s.key }
            },
            h.span({ className: `${C}-swatch ${C}-seg-${s.key}` }),
            `${s.label} ${formatMiB(s.mib)}`
          )
        )
    ),
    h.div(
      { className: `${C}-card-foot` },
      `${card.kernels} kernel${card.kernels === 1 ? '' : 's'} on this card · ` +
        (measured
          ? `in use (measured) ${formatUsage(card.used_mib, card.total_mib)}, utilisation ${formatPercent(card.utilization)}`
          : 'use not measured yet') +
        (card.allowed ? '' : ' · not used for new kernels')
    )
  );
}

/** A line at `mib` on a bar of `scale` MiB (the quota or the reservation), drawn to stay visible on any fill. */
function marker(
  cls: string,
  mib: number,
  scale: number,
  title: string
): VirtualElement {
  return h.div({
    className: `${C}-marker ${C}-marker-${cls}`,
    title,
    style: { left: `${Math.min(100, (100 * mib) / scale).toFixed(2)}%` }
  });
}

/**
 * Use against the kernel's reservation (what the server judges it by): the fill
 * is the measured use, coloured by the server's severity; a line at the quota,
 * one at the end of the reservation when use passes it, a tick at the peak.
 */
function quotaBar(k: IKernel, severity: string): VirtualElement {
  const limit = isMeasured(k.reserved_mib) ? k.reserved_mib : null;
  const q = quotaMiB(k);
  if (limit === null || q === null) {
    return h.div({ className: `${C}-quota-none` });
  }
  const used = isMeasured(k.used_mib) ? k.used_mib : null;
  const peak = isMeasured(k.peak_mib) ? k.peak_mib : null;
  const scale = Math.max(limit, used ?? 0, peak ?? 0, 1);
  const cls =
    severity === 'error' ? 'over' : severity === 'warn' ? 'near' : 'used';
  const marks = [
    marker('quota', q, scale, `quota ${formatMiB(q)}`),
    ...(scale > limit
      ? [marker('limit', limit, scale, `reservation ${formatMiB(limit)}`)]
      : []),
    ...(peak !== null && peak > 0
      ? [marker('peak', peak, scale, `peak ${formatMiB(peak)}`)]
      : [])
  ];
  const label =
    used === null
      ? `use not measured yet (reservation ${formatMiB(limit)})`
      : `${formatUsage(used, limit)}${peak !== null ? ` · peak ${formatMiB(peak)}` : ''}`;
  return h.div(
    { className: `${C}-quota` },
    bar(
      used !== null
        ? [{ cls, mib: used, title: `using ${formatMiB(used)}` }]
        : [],
      scale,
      marks,
      `GPU memory: ${label}, of a reservation of ${formatMiB(limit)} (quota ${formatMiB(q)} + CUDA context)`
    ),
    h.div(
      {
        className: `${C}-quota-label`,
        title: `of its reservation: quota ${formatMiB(q)} + ${formatMiB(k.reserve_mib)} for the CUDA context`
      },
      label
    )
  );
}

/** The kernel's use over the last minutes, with its quota and reservation as lines: how a loop grows. */
function timeline(k: IKernel): VirtualElement | null {
  const points = k.history ?? [];
  const limit = k.reserved_mib;
  const q = quotaMiB(k);
  if (points.length < 2 || !isMeasured(limit) || q === null) {
    return null;
  }
  const W = 200;
  const H = 32;
  const t0 = points[0][0];
  const span = Math.max(1, points[points.length - 1][0] - t0);
  const top = Math.max(limit, ...points.map(p => p[1])) * 1.05;
  const x = (t: number) => ((t - t0) / span) * W;
  const y = (mib: number) => H - (mib / top) * H;
  const peak = Math.max(...points.map(p => p[1]));
  const line = points
    .map(p => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`)
    .join(' ');
  const svg =
    `<svg viewBox="0 0 ${W} ${H}" preserveAspectRatio="none" aria-hidden="true">` +
    `<line class="${C}-tl-limit" x1="0" x2="${W}" y1="${y(limit).toFixed(1)}" y2="${y(limit).toFixed(1)}"/>` +
    `<line class="${C}-tl-quota" x1="0" x2="${W}" y1="${y(q).toFixed(1)}" y2="${y(q).toFixed(1)}"/>` +
    `<polyline class="${C}-tl-use" points="${line}"/></svg>`;
  const minutes = formatDuration(span);
  return h.div(
    {
      className: `${C}-timeline`,
      role: 'img',
      'aria-label': `GPU memory over the last ${minutes}: from ${formatMiB(points[0][1])} to ${formatMiB(points[points.length - 1][1])}, peak ${formatMiB(peak)}, quota ${formatMiB(q)}`,
      title: `Use over the last ${minutes} (peak ${formatMiB(peak)}); lines: quota ${formatMiB(q)}, reservation ${formatMiB(limit)}`
    },
    h.div({ className: `${C}-timeline-svg`, dataset: { svg } })
  );
}

const FRAMEWORK_NAMES: { [name: string]: string } = {
  cupy: 'CuPy',
  jax: 'JAX',
  tensorflow: 'TensorFlow',
  torch: 'PyTorch'
};

function frameworks(k: IKernel): VirtualElement | null {
  const fw = k.frameworks;
  if (!fw || Object.keys(fw).length === 0) {
    return null;
  }
  // What the kernel's own processes wrote about themselves: student code can forge it, so it is shown
  // as the kernel's word (the server enforces the reservation whatever a report says).
  return h.div(
    {
      className: `${C}-frameworks`,
      title: 'As reported by the kernel’s own processes'
    },
    h.span({ className: `${C}-fw-source` }, 'reported by the kernel:'),
    ...Object.keys(fw)
      .sort()
      .map(name => {
        const f = fw[name];
        return h.span(
          {
            className: `${C}-fw ${f.capped ? `${C}-fw-capped` : `${C}-fw-uncapped`}`,
            title: `${f.detail ?? ''} (reported by the kernel)`
          },
          `${name} ${f.capped ? `capped${isMeasured(f.limit_mib) ? ` ${formatMiB(f.limit_mib)}` : ''}` : 'not capped'}`
        );
      })
  );
}

/** How the server holds the kernel: its processes (cgroup or tree), its cards, its watchdog. */
function held(k: IKernel): VirtualElement | null {
  const how = k.held;
  if (!how) {
    return null;
  }
  const parts = [
    how.tracking === 'cgroup' ? 'own cgroup' : 'process tree',
    how.card_isolation ? 'other cards closed' : 'other cards not closed',
    how.watchdog ? `over quota: ${how.watchdog}` : ''
  ].filter(Boolean);
  const why = how.reason ? ` ${how.reason}.` : '';
  return h.div(
    {
      className: `${C}-held`,
      title:
        'How the server holds this kernel: whatever it starts stays counted as its own (cgroup) or only its ' +
        'process tree; whether it can open cards outside its reservation; what happens when it uses more ' +
        `than its reservation.${why}`
    },
    `Held by the server: ${parts.join(' · ')}`
  );
}

function button(
  cls: string,
  text: string,
  label: string,
  onclick: () => void
): VirtualElement {
  return h.button(
    {
      className: `jp-Button ${C}-btn ${C}-${cls}`,
      title: label,
      'aria-label': label,
      onclick
    },
    text
  );
}

function renderKernel(
  k: IKernel,
  isCurrent: boolean,
  view: IPanelView,
  actions: IKernelActions
): VirtualElement {
  const s = statusOf(k);
  const name = actions.nameOf(k);
  const where = k.card
    ? (k.card.label ?? `GPU ${k.card.index}`)
    : k.state === 'queued'
      ? 'waiting'
      : 'no card';
  const quota = isMeasured(k.quota_mib)
    ? `quota ${formatMiB(k.quota_mib)}`
    : k.quota
      ? `quota ${k.quota}`
      : '';
  const reserve =
    isMeasured(k.reserve_mib) && isMeasured(k.reserved_mib)
      ? ` + ${formatMiB(k.reserve_mib)} CUDA context = ${formatMiB(k.reserved_mib)} reserved`
      : '';
  const fw = view.settings.showFrameworks ? frameworks(k) : null;
  const learned = historyText(k);
  const tl =
    k.state === 'queued' || k.state === 'starting' ? null : timeline(k);
  const act: VirtualElement[] = [];
  // the quota to restart with after an out-of-memory error, in the server's words
  const retryMib = k.oom?.retry_quota_mib;
  const retry = isMeasured(retryMib) ? formatMiB(retryMib) : null;
  if (retryMib && retry && k.state !== 'queued') {
    act.push(
      button(
        'retry-btn',
        `Restart with ${retry}`,
        `Restart ${name} with a ${retry} GPU quota (it ran out of memory; waits if the GPU is full)`,
        () => void actions.restartWith(k, retryMib)
      )
    );
  }
  if (k.state !== 'none' && k.state !== 'queued') {
    act.push(
      button(
        'quota-btn',
        'Change quota…',
        `Change the GPU quota of ${name} (restarts it)`,
        () => void actions.changeQuota(k)
      )
    );
  }
  act.push(
    k.state === 'queued'
      ? button(
          'stop-btn',
          'Stop waiting',
          `Stop waiting for a GPU for ${name}`,
          () => void actions.stopWaiting(k)
        )
      : button(
          'shutdown-btn',
          'Shut down',
          `Shut down ${name}`,
          () => void actions.shutdown(k)
        )
  );
  return h.li(
    {
      className: `${C}-kernel ${C}-state-${k.state}${isCurrent ? ` ${C}-current` : ''}`,
      dataset: {
        kernelId: k.kernel_id,
        state: String(k.state),
        severity: s.severity
      },
      'aria-current': isCurrent ? 'true' : undefined
    },
    h.div(
      { className: `${C}-kernel-head` },
      k.path
        ? h.button(
            {
              className: `${C}-link`,
              title: `Open ${k.path}`,
              'aria-label': `Open ${name}`,
              onclick: () => actions.open(k)
            },
            name
          )
        : h.span({ className: `${C}-kernel-name` }, name),
      h.span(
        { className: `${C}-badge ${C}-sev-${s.severity}`, title: s.detail },
        s.label
      )
    ),
    h.div(
      { className: `${C}-kernel-meta` },
      [
        where,
        quota + reserve,
        k.pending_quota ? `→ ${k.pending_quota} at next restart` : ''
      ]
        .filter(Boolean)
        .join(' · ')
    ),
    ...(learned ? [h.div({ className: `${C}-kernel-history` }, learned)] : []),
    ...(k.oom
      ? [
          h.div(
            { className: `${C}-kernel-oom`, role: 'status' },
            say('event.out-of-memory', {
              framework: FRAMEWORK_NAMES[k.oom.framework] ?? k.oom.framework,
              quota_mib: quotaMiB(k),
              retry_mib: retryMib
            })
          )
        ]
      : []),
    ...(k.state === 'queued' || k.state === 'starting'
      ? []
      : [quotaBar(k, s.severity)]),
    ...(tl ? [tl] : []),
    ...(isMeasured(k.utilization)
      ? [
          h.div(
            { className: `${C}-kernel-util` },
            `GPU utilisation ${formatPercent(k.utilization)}`
          )
        ]
      : []),
    ...(fw ? [fw] : []),
    ...[held(k)].filter((e): e is VirtualElement => e !== null),
    ...(s.severity !== 'ok'
      ? [
          h.div(
            { className: `${C}-kernel-detail ${C}-sev-text-${s.severity}` },
            s.detail
          )
        ]
      : []),
    h.div({ className: `${C}-actions` }, ...act)
  );
}

function renderStatus(snapshot: ISnapshot): VirtualElement[] {
  const err = snapshot.error;
  const state = snapshot.state;
  if (err && (err.kind === 'missing' || state === null)) {
    return [
      err.kind === 'missing'
        ? notice(
            'error',
            'The GPU quota server extension is not running',
            'This Jupyter server does not answer /api/gpushare/ (404). Ask the admin to install jupyter-gpushare in the server’s environment and enable it (jupyter server extension enable jupyter_gpushare), then restart Jupyter.'
          )
        : notice('error', 'GPU quotas cannot be read', err.message, 'Retrying…')
    ];
  }
  const out: VirtualElement[] = [];
  if (err) {
    out.push(
      notice('warn', 'Showing the last known figures', err.message, 'Retrying…')
    );
  }
  if (state === null) {
    out.push(h.div({ className: `${C}-loading` }, 'Loading…'));
    return out;
  }
  if (state.backend === 'none' || state.cards.length === 0) {
    out.push(
      notice(
        'info',
        'No GPU on this server',
        state.reason ?? 'No GPU was found.',
        'Notebooks run on the CPU here.'
      )
    );
  } else if (state.simulated) {
    out.push(
      notice(
        'info',
        'Simulated card',
        'These cards are simulated: quotas and queueing behave as on a real GPU, but there is no GPU memory behind them. In a notebook, gpushare_simulate.use("1.5GiB") pretends use.'
      )
    );
  }
  if (state.ledger?.error) {
    out.push(
      notice(
        'error',
        'Reservations are unavailable',
        state.ledger.error,
        'New kernels start without a GPU until the admin fixes this.'
      )
    );
  }
  return out;
}

/** The panel's content for one view (a pure function of it). */
export function renderPanel(
  view: IPanelView,
  actions: IKernelActions
): VirtualElement[] {
  const { snapshot, current, settings } = view;
  const out: VirtualElement[] = [
    h.div(
      { className: `${C}-header` },
      h.span({ className: `${C}-title` }, 'GPU memory'),
      ...(snapshot.state?.simulated
        ? [
            h.span(
              { className: `${C}-badge ${C}-sev-info ${C}-simulated` },
              'simulated'
            )
          ]
        : []),
      button('refresh', '↻', 'Refresh GPU memory quotas now', () =>
        actions.refresh()
      )
    ),
    ...renderStatus(snapshot)
  ];
  const state = snapshot.state;
  if (state === null || (snapshot.error && snapshot.error.kind === 'missing')) {
    return out;
  }
  if (settings.showCards && state.cards.length) {
    out.push(
      h.div({ className: `${C}-cards` }, ...state.cards.map(renderCard))
    );
  }
  const waiting = state.queue.length;
  const mineWaiting = state.queue.filter(q => q.mine).length;
  if (waiting) {
    out.push(
      h.div(
        { className: `${C}-queue` },
        `${waiting} kernel${waiting === 1 ? '' : 's'} waiting for a GPU on this host` +
          (mineWaiting ? ` (${mineWaiting} of them yours)` : '')
      )
    );
  }
  const kernels = state.kernels;
  const mine = view.currentKernel;
  if (current.hasSession && !mine) {
    out.push(
      notice(
        'muted',
        current.kernelId
          ? 'This notebook’s kernel has no GPU quota'
          : 'This notebook’s kernel is not started',
        current.kernelId
          ? 'The server did not give this kernel a quota (it may have started before the extension, or be shutting down).'
          : 'Run a cell (or Kernel › Restart) to start its kernel and reserve GPU memory.'
      )
    );
  }
  const sorted = [...kernels].sort(
    (a, b) =>
      (a === mine ? 0 : 1) - (b === mine ? 0 : 1) ||
      (a.since ?? 0) - (b.since ?? 0)
  );
  out.push(
    h.div({ className: `${C}-section-title` }, `My kernels (${kernels.length})`)
  );
  out.push(
    kernels.length === 0
      ? h.div(
          { className: `${C}-empty` },
          'No kernel holds or waits for GPU memory. Open a notebook to start one.'
        )
      : h.ul(
          { className: `${C}-kernels` },
          ...sorted.map(k => renderKernel(k, k === mine, view, actions))
        )
  );
  const cfg = state.config;
  out.push(
    h.div(
      { className: `${C}-config` },
      [
        say('config.rules', {
          default: sizeText(cfg.default_quota),
          max: sizeText(cfg.max_quota),
          reserve_mib: cfg.context_reserve_mib
        }),
        cfg.on_full ? say(`config.${cfg.on_full}`) : ''
      ]
        .filter(Boolean)
        .join(' ')
    )
  );
  out.push(
    renderHostSection({
      snapshot,
      open: view.hostOpen,
      toggle: () => actions.toggleHost(),
      nameOf: k => actions.nameOf(k)
    })
  );
  return out;
}

/** The right sidebar panel. */
export class GpuSharePanel extends Widget {
  constructor(
    readonly model: GpuShareModel,
    readonly tracker: KernelTracker,
    readonly actions: IKernelActions
  ) {
    super();
    this.addClass(C);
    this.node.setAttribute('role', 'region');
    this.node.setAttribute('aria-label', 'GPU memory quotas');
    model.changed.connect(this._schedule, this);
    tracker.changed.connect(this._schedule, this);
  }

  /** Milliseconds the last render took (virtual DOM diff + layout). */
  lastRenderMs = 0;

  /** Render now (synchronously) and return how long it took, layout included. */
  renderNow(view?: IPanelView): number {
    const t0 = performance.now();
    const v: IPanelView = view ?? {
      snapshot: this.model.snapshot,
      current: this.tracker.current,
      currentKernel: this.tracker.currentKernel,
      settings: this.model.settings,
      hostOpen: this.model.hostOpen
    };
    VirtualDOM.render(renderPanel(v, this.actions), this.node);
    for (const el of Array.from(
      this.node.querySelectorAll<HTMLElement>(`.${C}-timeline-svg`)
    )) {
      if (el.dataset.svg !== el.dataset.drawn) {
        el.innerHTML = el.dataset.svg ?? ''; // our own markup of numbers only (virtualdom has no SVG)
        el.dataset.drawn = el.dataset.svg;
      }
    }
    void this.node.offsetHeight; // force layout so that it is counted
    this.lastRenderMs = performance.now() - t0;
    this.node.dataset.renderMs = this.lastRenderMs.toFixed(2);
    return this.lastRenderMs;
  }

  protected onAfterShow(): void {
    this.model.setPanelVisible(true);
    this.renderNow();
  }

  protected onAfterHide(): void {
    this.model.setPanelVisible(false);
  }

  protected onAfterAttach(): void {
    this.model.setPanelVisible(this.isVisible);
    this.renderNow();
  }

  protected onBeforeDetach(): void {
    this.model.setPanelVisible(false);
  }

  private _schedule(): void {
    if (!this.isVisible || this._pending) {
      return;
    }
    this._pending = true;
    requestAnimationFrame(() => {
      this._pending = false;
      if (!this.isDisposed) {
        this.renderNow();
      }
    });
  }

  private _pending = false;
}
