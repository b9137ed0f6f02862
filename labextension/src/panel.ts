import { Widget } from '@lumino/widgets';
import { h, VirtualDOM, VirtualElement } from '@lumino/virtualdom';

import { IKernelActions } from './actions';
import { bar, C, cardHead, notice } from './dom';
import {
  cardLabel,
  formatMiB,
  formatPercent,
  formatUsage,
  isMeasured
} from './format';
import { renderHostSection } from './hostpanel';
import { GpuShareModel, ISettings, ISnapshot } from './model';
import { historyText, IWorded, quotaMiB, statusOf } from './state';
import { keepRoomForToasts } from './toastroom';
import { ICurrent, KernelTracker } from './tracker';
import type { ICard, IKernel } from './types';
import {
  FRAMEWORK_NAMES,
  say,
  segmentText,
  segmentTitle,
  sizeText
} from './words';

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
      segs.map(s => ({ cls: s.key, mib: s.mib, title: segmentTitle(s) })),
      card.total_mib,
      undefined,
      say('ui.card.bar', {
        card: cardLabel(card),
        total_mib: card.total_mib,
        parts: segs
          .filter(s => s.mib > 0)
          .map(s => segmentText(s))
          .join(', ')
      })
    ),
    h.div(
      { className: `${C}-legend` },
      ...segs
        .filter(s => s.mib > 0 || s.key === 'mine' || s.key === 'free')
        .map(s =>
          h.span(
            {
              className: `${C}-legend-item`,
              title: segmentTitle(s),
              dataset: { key: s.key }
            },
            h.span({ className: `${C}-swatch ${C}-seg-${s.key}` }),
            segmentText(s)
          )
        )
    ),
    h.div(
      { className: `${C}-card-foot` },
      [
        say('ui.card.kernels', {
          n: card.kernels
        }),
        measured
          ? say('ui.card.measured', {
              usage: formatUsage(card.used_mib, card.total_mib),
              utilisation: formatPercent(card.utilization)
            })
          : say('ui.card.unmeasured'),
        card.allowed ? '' : say('ui.card.not_used')
      ]
        .filter(Boolean)
        .join(' · ')
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
    marker('quota', q, scale, say('ui.bar.quota', { quota_mib: q })),
    ...(scale > limit
      ? [
          marker(
            'limit',
            limit,
            scale,
            say('ui.bar.reservation', { reserved_mib: limit })
          )
        ]
      : []),
    ...(peak !== null && peak > 0
      ? [marker('peak', peak, scale, say('ui.bar.peak', { peak_mib: peak }))]
      : [])
  ];
  const label =
    used === null
      ? say('ui.bar.unmeasured', { reserved_mib: limit })
      : [
          formatUsage(used, limit),
          peak !== null ? say('ui.bar.peak', { peak_mib: peak }) : ''
        ]
          .filter(Boolean)
          .join(' · ');
  return h.div(
    { className: `${C}-quota` },
    bar(
      used !== null
        ? [{ cls, mib: used, title: say('ui.bar.using', { used_mib: used }) }]
        : [],
      scale,
      marks,
      say('ui.bar.label', { label, reserved_mib: limit, quota_mib: q })
    ),
    h.div(
      {
        className: `${C}-quota-label`,
        title: say('ui.bar.title', { quota_mib: q, reserve_mib: k.reserve_mib })
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
  return h.div(
    {
      className: `${C}-timeline`,
      role: 'img',
      'aria-label': say('ui.timeline.label', {
        span_s: span,
        from_mib: points[0][1],
        to_mib: points[points.length - 1][1],
        peak_mib: peak,
        quota_mib: q
      }),
      title: say('ui.timeline.title', {
        span_s: span,
        peak_mib: peak,
        quota_mib: q,
        reserved_mib: limit
      })
    },
    h.div({ className: `${C}-timeline-svg`, dataset: { svg } })
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
      title: say('ui.fw.title')
    },
    h.span({ className: `${C}-fw-source` }, say('ui.fw.source')),
    ...Object.keys(fw)
      .sort()
      .map(name => {
        const f = fw[name];
        return h.span(
          {
            className: `${C}-fw ${f.capped ? `${C}-fw-capped` : `${C}-fw-uncapped`}`,
            title: say('ui.fw.detail', { detail: f.detail ?? '' })
          },
          say(f.capped ? 'ui.fw.capped' : 'ui.fw.uncapped', {
            name: FRAMEWORK_NAMES[name] ?? name, // one name per framework
            limit_mib: f.limit_mib
          })
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
    say(
      how.tracking !== 'cgroup'
        ? 'ui.held.tree'
        : how.escapable
          ? 'ui.held.cgroup_escapable'
          : 'ui.held.cgroup'
    ),
    say(how.card_isolation ? 'ui.held.closed' : 'ui.held.open'),
    how.allocation ? say('ui.held.allocation') : '',
    how.watchdog ? say('ui.held.watchdog', { action: how.watchdog }) : ''
  ].filter(Boolean);
  return h.div(
    {
      className: `${C}-held`,
      title: say('ui.held.title', {
        parts: parts.join(' · '),
        reason: how.reason
      })
    },
    say('ui.held', { level: say(`ui.level.${how.level ?? 'caps'}`) })
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
    ? cardLabel(k.card)
    : say(k.state === 'queued' ? 'ui.kernel.waiting' : 'ui.kernel.no_card');
  const quotaMib = k.quota_mib ?? k.requested_quota_mib;
  const quota = isMeasured(quotaMib)
    ? say(
        isMeasured(k.reserve_mib) && isMeasured(k.reserved_mib)
          ? 'ui.kernel.quota_reserved'
          : 'ui.kernel.quota',
        {
          quota_mib: quotaMib,
          reserve_mib: k.reserve_mib,
          reserved_mib: k.reserved_mib
        }
      )
    : '';
  const fw = view.settings.showFrameworks ? frameworks(k) : null;
  const learned = historyText(k);
  const holdsNone = ['queued', 'starting', 'standby'].includes(k.state); // no reservation: no bar, no timeline
  const tl = holdsNone ? null : timeline(k);
  const act: VirtualElement[] = [];
  // the quota to restart with after an out-of-memory error, in the server's words
  const retryMib = k.oom?.retry_quota_mib;
  if (retryMib && isMeasured(retryMib) && k.state !== 'queued') {
    act.push(
      button(
        'retry-btn',
        say('ui.btn.retry', { quota_mib: retryMib }),
        say('ui.btn.retry_label', { name, quota_mib: retryMib }),
        () => void actions.restartWith(k, retryMib)
      )
    );
  }
  if (k.state !== 'none' && k.state !== 'queued') {
    act.push(
      button(
        'quota-btn',
        say('ui.btn.quota'),
        say(
          k.state === 'standby'
            ? 'ui.btn.quota_label_first_use'
            : 'ui.btn.quota_label',
          { name }
        ),
        () => void actions.changeQuota(k)
      )
    );
  }
  act.push(
    k.state === 'queued'
      ? button(
          'stop-btn',
          say('ui.stop.button'),
          say('ui.stop.label', { name }),
          () => void actions.stopWaiting(k)
        )
      : button(
          'shutdown-btn',
          say('ui.btn.shutdown'),
          say('ui.btn.shutdown_label', { name }),
          () => void actions.shutdown(k)
        )
  );
  return h.li(
    {
      key: k.kernel_id, // the card moves with its kernel, its opened details with it
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
              title: say('ui.open', { name: k.path }),
              'aria-label': say('ui.open', { name }),
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
        quota,
        isMeasured(k.pending_quota_mib)
          ? say('ui.kernel.pending', { quota_mib: k.pending_quota_mib })
          : ''
      ]
        .filter(Boolean)
        .join(' · ')
    ),
    ...(learned ? [h.div({ className: `${C}-kernel-history` }, learned)] : []),
    ...(k.oom && k.state !== 'queued' // (in line it has no quota to speak of: no "at quota –")
      ? [
          h.div(
            { className: `${C}-kernel-oom`, role: 'status' },
            say('event.out-of-memory', {
              framework: k.oom.framework, // worded by say(): one name per framework
              quota_mib: quotaMiB(k) ?? k.requested_quota_mib,
              retry_mib: retryMib
            })
          )
        ]
      : []),
    ...(holdsNone ? [] : [quotaBar(k, s.severity)]),
    // what the student acts on stays in sight (a warning's sentence says what to do); the rest is one click away
    ...(s.severity !== 'ok' && k.state !== 'queued' ? [detail(s)] : []),
    h.div({ className: `${C}-actions` }, ...act),
    more(k, [
      ...(k.state === 'queued' ? [detail(s)] : []), // the banner's sentence, in full
      ...(tl ? [tl] : []),
      ...(isMeasured(k.utilization)
        ? [
            h.div(
              { className: `${C}-kernel-util` },
              say('ui.kernel.utilisation', {
                utilisation: formatPercent(k.utilization)
              })
            )
          ]
        : []),
      ...(fw ? [fw] : []),
      ...[held(k)].filter((e): e is VirtualElement => e !== null)
    ])
  );
}

function detail(s: IWorded): VirtualElement {
  return h.div(
    { className: `${C}-kernel-detail ${C}-sev-text-${s.severity}` },
    s.detail
  );
}

/** A kernel's details behind a disclosure (closed at first): its history, caps, and how the server holds it. */
function more(k: IKernel, parts: VirtualElement[]): VirtualElement {
  if (parts.length === 0) {
    return h.div({ className: `${C}-more-none` });
  }
  return h(
    'details',
    { className: `${C}-more`, key: `more-${k.kernel_id}` },
    h.summary({ className: `${C}-more-summary` }, say('ui.kernel.more')),
    ...parts
  );
}

function renderStatus(snapshot: ISnapshot): VirtualElement[] {
  const err = snapshot.error;
  const state = snapshot.state;
  if (err && (err.kind === 'missing' || state === null)) {
    return [
      err.kind === 'missing'
        ? notice('error', say('ui.missing.title'), say('ui.missing.body'))
        : notice(
            'error',
            say('ui.unreadable.title'),
            err.message,
            say('ui.retrying')
          )
    ];
  }
  const out: VirtualElement[] = [];
  if (err) {
    out.push(
      notice('warn', say('ui.stale.title'), err.message, say('ui.retrying'))
    );
  }
  if (state === null) {
    out.push(h.div({ className: `${C}-loading` }, say('ui.loading')));
    return out;
  }
  if (state.backend === 'none' || state.cards.length === 0) {
    out.push(
      notice(
        'info',
        say('ui.nogpu.title'),
        state.reason ?? say('ui.nogpu.body'),
        say('ui.nogpu.cpu')
      )
    );
  } else if (state.simulated) {
    out.push(
      notice('info', say('ui.simulated.title'), say('ui.simulated.body'))
    );
  }
  if (state.ledger?.error) {
    out.push(
      notice(
        'error',
        say('ui.ledger.title'),
        state.ledger.error,
        say('ui.ledger.body')
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
      h.span({ className: `${C}-title` }, say('ui.title')),
      ...(snapshot.state?.simulated
        ? [
            h.span(
              { className: `${C}-badge ${C}-sev-info ${C}-simulated` },
              say('ui.simulated')
            )
          ]
        : []),
      button('refresh', '↻', say('ui.refresh'), () => actions.refresh())
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
        say('ui.queue', {
          n: waiting,
          mine: mineWaiting || null
        })
      )
    );
  }
  const kernels = state.kernels;
  const mine = view.currentKernel;
  if (current.hasSession && !mine) {
    out.push(
      notice(
        'muted',
        say(current.kernelId ? 'ui.noquota.title' : 'ui.nokernel.title'),
        say(current.kernelId ? 'ui.noquota.body' : 'ui.nokernel.body')
      )
    );
  }
  const sorted = [...kernels].sort(
    (a, b) =>
      (a === mine ? 0 : 1) - (b === mine ? 0 : 1) ||
      (a.since ?? 0) - (b.since ?? 0)
  );
  out.push(
    h.div(
      { className: `${C}-section-title` },
      say('ui.kernels', { n: kernels.length })
    )
  );
  out.push(
    kernels.length === 0
      ? h.div({ className: `${C}-empty` }, say('ui.kernels.none'))
      : h.ul(
          // keyed: a notice that comes and goes above it (a notebook whose kernel is not listed yet) would shift it
          // to another place among its siblings, and the list would be made anew, every opened details closed
          { className: `${C}-kernels`, key: 'kernels' },
          ...sorted.map(k => renderKernel(k, k === mine, view, actions))
        )
  );
  const cfg = state.config;
  out.push(
    h.div(
      { className: `${C}-config` },
      [
        say('ui.config.rules', {
          default: sizeText(cfg.default_quota),
          max: sizeText(cfg.max_quota),
          reserve_mib: cfg.context_reserve_mib
        }),
        cfg.on_full ? say(`ui.config.${cfg.on_full}`) : ''
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
      nameOf: k => actions.nameOf(k),
      act: (target, action) => void actions.actOnHost(target, action)
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
    this._toastRoom = keepRoomForToasts(this.node);
  }

  protected onBeforeDetach(): void {
    this.model.setPanelVisible(false);
    this._toastRoom?.();
    this._toastRoom = null;
  }

  private _toastRoom: (() => void) | null = null;

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
