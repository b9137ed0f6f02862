import { Widget } from '@lumino/widgets';
import { h, VirtualDOM, VirtualElement } from '@lumino/virtualdom';

import {
  basename,
  cardLabel,
  formatDuration,
  formatMiB,
  formatPercent,
  formatUsage,
  isMeasured
} from './format';
import { bar, C, cardHead, notice } from './dom';
import { renderHostSection } from './hostpanel';
import { GpuShareModel, ISettings, ISnapshot, ICurrent } from './model';
import { cardSegments, describeState, findKernel, quotaMiB } from './state';
import type { ICard, IKernel } from './types';

/** What the panel's buttons do (index.ts wires them to JupyterLab). */
export interface IPanelActions {
  open(kernel: IKernel): void;
  changeQuota(kernel: IKernel): void;
  shutdown(kernel: IKernel): void;
  /** Stop waiting for a GPU (a queued kernel). */
  stopWaiting(kernel: IKernel): void;
  refresh(): void;
  /** Open or close the "This host" section. */
  toggleHost(): void;
  /** The notebook path to show for a kernel (from its session when known). */
  pathOf(kernel: IKernel): string | null;
}

export interface IPanelView {
  snapshot: ISnapshot;
  current: ICurrent;
  settings: ISettings;
  /** The "This host" section is open. */
  hostOpen: boolean;
}

function renderCard(card: ICard, mine: IKernel[]): VirtualElement {
  const segs = cardSegments(card, mine);
  const measured = isMeasured(card.used_mib);
  return h.div(
    {
      className: `${C}-card${card.allowed ? '' : ` ${C}-card-disallowed`}`,
      dataset: { uuid: card.uuid }
    },
    cardHead(card, formatMiB(card.total_mib)),
    bar(
      segs.map(s => ({
        cls: s.key,
        mib: s.mib,
        title: `${s.label}: ${formatMiB(s.mib)}${s.detail ? `, ${s.detail}` : ''}`
      })),
      card.total_mib
    ),
    h.div(
      { className: `${C}-legend` },
      ...segs
        .filter(s => s.mib > 0 || s.key === 'mine' || s.key === 'free')
        .map(s =>
          h.span(
            { className: `${C}-legend-item` },
            h.span({ className: `${C}-swatch ${C}-seg-${s.key}` }),
            `${s.label} ${formatMiB(s.mib)}`
          )
        )
    ),
    h.div(
      { className: `${C}-card-foot` },
      `${card.kernels} kernel${card.kernels === 1 ? '' : 's'} on this card · ` +
        (measured
          ? `measured use ${formatMiB(card.used_mib)}, utilisation ${formatPercent(card.utilization)}`
          : 'usage not measured yet') +
        (card.allowed ? '' : ' · not used for new kernels')
    )
  );
}

function quotaBar(k: IKernel, state: string): VirtualElement {
  const q = quotaMiB(k);
  if (q === null) {
    return h.div({ className: `${C}-quota-none` });
  }
  const used = isMeasured(k.used_mib) ? k.used_mib : null;
  const peak = isMeasured(k.peak_mib) ? k.peak_mib : null;
  const scale = Math.max(q, used ?? 0, peak ?? 0, 1);
  const cls =
    state === 'over_quota' ? 'over' : state === 'near_quota' ? 'near' : 'used';
  const peakMark =
    peak !== null && peak > 0
      ? h.div({
          className: `${C}-peak`,
          title: `peak ${formatMiB(peak)}`,
          style: { left: `${Math.min(100, (100 * peak) / scale).toFixed(2)}%` }
        })
      : undefined;
  const quotaMark =
    scale > q
      ? h.div({
          className: `${C}-quota-line`,
          title: `quota ${formatMiB(q)}`,
          style: { left: `${((100 * q) / scale).toFixed(2)}%` }
        })
      : undefined;
  const label =
    used === null
      ? 'usage not measured yet'
      : `${formatUsage(used, q)}${peak !== null ? ` · peak ${formatMiB(peak)}` : ''}`;
  return h.div(
    { className: `${C}-quota` },
    h.div(
      { className: `${C}-quota-bar-wrap` },
      bar(
        used !== null
          ? [{ cls, mib: used, title: `using ${formatMiB(used)}` }]
          : [],
        scale,
        peakMark
      ),
      ...(quotaMark ? [quotaMark] : [])
    ),
    h.div({ className: `${C}-quota-label` }, label)
  );
}

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

function renderKernel(
  k: IKernel,
  isCurrent: boolean,
  view: IPanelView,
  actions: IPanelActions
): VirtualElement {
  const s = describeState(k, view.settings.nearQuotaPercent / 100);
  const path = actions.pathOf(k);
  const name =
    basename(path) || `${k.kernel_name} kernel ${k.kernel_id.slice(0, 8)}`;
  const where = k.card
    ? cardLabel(k.card)
    : k.state === 'queued'
      ? 'waiting'
      : 'no card';
  const quota = k.quota ? `quota ${k.quota}` : '';
  const reserve =
    isMeasured(k.reserve_mib) && isMeasured(k.reserved_mib)
      ? ` + ${formatMiB(k.reserve_mib)} CUDA context = ${formatMiB(k.reserved_mib)} held`
      : '';
  const canAct = k.state !== 'none';
  const fw = view.settings.showFrameworks ? frameworks(k) : null;
  return h.li(
    {
      className: `${C}-kernel ${C}-state-${s.state}${isCurrent ? ` ${C}-current` : ''}`,
      dataset: { kernelId: k.kernel_id, state: s.state }
    },
    h.div(
      { className: `${C}-kernel-head` },
      path
        ? h.button(
            {
              className: `${C}-link`,
              title: `Open ${path}`,
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
    ...(k.state === 'queued' || k.state === 'starting'
      ? []
      : [quotaBar(k, s.state)]),
    ...(isMeasured(k.utilization)
      ? [
          h.div(
            { className: `${C}-kernel-util` },
            `GPU utilisation ${formatPercent(k.utilization)}`
          )
        ]
      : []),
    ...(fw ? [fw] : []),
    ...(s.state !== 'running'
      ? [
          h.div(
            { className: `${C}-kernel-detail ${C}-sev-text-${s.severity}` },
            s.detail +
              (k.state === 'queued' && isMeasured(k.waited_s)
                ? ` Waited ${formatDuration(k.waited_s)}.`
                : '')
          )
        ]
      : []),
    h.div(
      { className: `${C}-actions` },
      ...(canAct && k.state !== 'queued'
        ? [
            h.button(
              {
                className: `jp-Button ${C}-btn ${C}-quota-btn`,
                title:
                  'Ask for another quota; the kernel restarts (its state is lost)',
                onclick: () => actions.changeQuota(k)
              },
              'Change quota…'
            )
          ]
        : []),
      ...(k.state === 'queued'
        ? [
            h.button(
              {
                className: `jp-Button ${C}-btn ${C}-stop-btn`,
                title: 'Stop waiting for a GPU: the kernel is not started',
                onclick: () => actions.stopWaiting(k)
              },
              'Stop waiting'
            )
          ]
        : [
            h.button(
              {
                className: `jp-Button ${C}-btn ${C}-shutdown-btn`,
                title: 'Shut this kernel down and give its GPU memory back',
                onclick: () => actions.shutdown(k)
              },
              'Shut down'
            )
          ])
    )
  );
}

/** The panel's content for one snapshot (a pure function of the view). */
export function renderPanel(
  view: IPanelView,
  actions: IPanelActions
): VirtualElement[] {
  const { snapshot, current, settings } = view;
  const out: VirtualElement[] = [];
  out.push(
    h.div(
      { className: `${C}-header` },
      h.span({ className: `${C}-title` }, 'GPU memory'),
      ...(snapshot.cards?.simulated
        ? [
            h.span(
              { className: `${C}-badge ${C}-sev-info ${C}-simulated` },
              'simulated'
            )
          ]
        : []),
      h.button(
        {
          className: `jp-Button ${C}-btn ${C}-refresh`,
          title: 'Refresh now',
          onclick: () => actions.refresh()
        },
        '↻'
      )
    )
  );
  const err = snapshot.error;
  if (err && (err.kind === 'missing' || snapshot.cards === null)) {
    if (err.kind === 'missing') {
      out.push(
        notice(
          'error',
          'The GPU quota server extension is not running',
          'This Jupyter server does not answer /api/gpushare/ (404). Ask the admin to install jupyter-gpushare in the server’s environment and enable it (jupyter server extension enable jupyter_gpushare), then restart Jupyter.'
        )
      );
    } else {
      out.push(
        notice('error', 'GPU quotas cannot be read', err.message, 'Retrying…')
      );
    }
    return out;
  }
  if (err) {
    out.push(
      notice('warn', 'Showing the last known figures', err.message, 'Retrying…')
    );
  }
  const cards = snapshot.cards;
  if (cards === null) {
    out.push(h.div({ className: `${C}-loading` }, 'Loading…'));
    return out;
  }
  if (cards.backend === 'none' || cards.cards.length === 0) {
    out.push(
      notice(
        'info',
        'No GPU on this server',
        cards.reason ?? 'No GPU was found.',
        'Notebooks run on the CPU here.'
      )
    );
  } else if (cards.simulated) {
    out.push(
      notice(
        'info',
        'Simulated card',
        'These cards are simulated: quotas and queueing behave as on a real GPU, but there is no GPU memory behind them.'
      )
    );
  }
  if (cards.ledger?.error) {
    out.push(
      notice(
        'error',
        'Reservations are unavailable',
        cards.ledger.error,
        'New kernels start without a GPU until the admin fixes this.'
      )
    );
  }
  const kernels = snapshot.kernels;
  if (settings.showCards && cards.cards.length) {
    out.push(
      h.div(
        { className: `${C}-cards` },
        ...cards.cards.map(c => renderCard(c, kernels))
      )
    );
  }
  const waiting = snapshot.queue.length;
  const mineWaiting = snapshot.queue.filter(q => q.mine).length;
  if (waiting) {
    out.push(
      h.div(
        { className: `${C}-queue` },
        `${waiting} kernel${waiting === 1 ? '' : 's'} waiting for a GPU on this host` +
          (mineWaiting ? ` (${mineWaiting} of them yours)` : '')
      )
    );
  }
  // The notebook in front.
  const mine = findKernel(kernels, current.kernelId, current.path);
  if (current.hasSession && !mine) {
    out.push(
      notice(
        'muted',
        current.kernelId
          ? 'This notebook’s kernel has no GPU quota'
          : 'This notebook’s kernel is not started',
        current.kernelId
          ? 'The server did not give this kernel a quota (it may have started before the extension, or be shutting down).'
          : 'Start its kernel (Kernel › Restart, or run a cell) to reserve GPU memory.'
      )
    );
  }
  const sorted = [...kernels].sort((a, b) => {
    const ac = a === mine ? 0 : 1;
    const bc = b === mine ? 0 : 1;
    return ac - bc || (a.since ?? 0) - (b.since ?? 0);
  });
  out.push(
    h.div({ className: `${C}-section-title` }, `My kernels (${kernels.length})`)
  );
  if (kernels.length === 0) {
    out.push(
      h.div(
        { className: `${C}-empty` },
        'No kernel holds or waits for GPU memory. Open a notebook to start one.'
      )
    );
  } else {
    out.push(
      h.ul(
        { className: `${C}-kernels` },
        ...sorted.map(k => renderKernel(k, k === mine, view, actions))
      )
    );
  }
  const cfg = snapshot.config;
  if (cfg) {
    out.push(
      h.div(
        { className: `${C}-config` },
        `Default quota ${cfg.default_quota ?? '–'}` +
          (cfg.max_quota ? `, at most ${cfg.max_quota}` : '') +
          (isMeasured(cfg.context_reserve_mib)
            ? `; each kernel also reserves ${formatMiB(cfg.context_reserve_mib)} for its CUDA context`
            : '') +
          (cfg.on_full === 'queue'
            ? '; when the GPU is full, kernels wait in line.'
            : cfg.on_full === 'cpu'
              ? '; when the GPU is full, kernels start on the CPU.'
              : cfg.on_full === 'reject'
                ? '; when the GPU is full, kernels are refused.'
                : '.')
      )
    );
  }
  out.push(
    renderHostSection({
      snapshot,
      open: view.hostOpen,
      toggle: () => actions.toggleHost(),
      pathOf: k => actions.pathOf(k)
    })
  );
  return out;
}

/** The right sidebar panel. */
export class GpuSharePanel extends Widget {
  constructor(
    readonly model: GpuShareModel,
    readonly actions: IPanelActions
  ) {
    super();
    this.addClass(C);
    this.node.setAttribute('role', 'region');
    this.node.setAttribute('aria-label', 'GPU memory quotas');
    model.changed.connect(this._schedule, this);
  }

  /** Milliseconds the last render took (virtual DOM diff + layout). */
  lastRenderMs = 0;

  /** Render now (synchronously) and return how long it took, layout included. */
  renderNow(view?: IPanelView): number {
    const t0 = performance.now();
    const v: IPanelView = view ?? {
      snapshot: this.model.snapshot,
      current: this.model.current,
      settings: this.model.settings,
      hostOpen: this.model.hostOpen
    };
    VirtualDOM.render(renderPanel(v, this.actions), this.node);
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
