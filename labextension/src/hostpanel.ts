/**
 * The panel's collapsible "This host" section: every reservation on the host
 * as this user may see it (GET /api/gpushare/host). Students see other users
 * only as one total per card and nameless queue places; admins see every
 * user's kernels.
 */
import { h, VirtualElement } from '@lumino/virtualdom';

import { bar, C, cardHead, notice } from './dom';
import { formatMiB } from './format';
import {
  hostKernelRows,
  limitsText,
  limitsUse,
  queueEntryText,
  usersTotal
} from './host';
import type { IModelError, ISnapshot } from './model';
import type { IHostCard, IHostView, IKernel } from './types';

/** What the section needs from the panel. */
export interface IHostSectionProps {
  snapshot: ISnapshot;
  open: boolean;
  toggle(): void;
  /** The name (notebook) of a kernel this server runs. */
  nameOf(kernel: IKernel): string;
}

function hostCard(card: IHostCard): VirtualElement {
  const segs = card.segments ?? []; // the server's split, in the panel's words (state.py card_segments)
  return h.div(
    {
      className: `${C}-host-card${card.allowed ? '' : ` ${C}-card-disallowed`}`,
      dataset: { uuid: card.uuid }
    },
    cardHead(card, formatMiB(card.total_mib)),
    bar(
      segs.map(s => ({ cls: s.key, mib: s.mib, title: s.title })),
      card.total_mib
    ),
    h.div(
      { className: `${C}-legend` },
      ...segs
        .filter(s => s.mib > 0 || s.key !== 'headroom')
        .map(s =>
          h.span(
            {
              className: `${C}-legend-item ${C}-host-${s.key}`,
              title: s.title
            },
            h.span({ className: `${C}-swatch ${C}-seg-${s.key}` }),
            `${s.label} ${formatMiB(s.mib)}`
          )
        )
    )
  );
}

function limits(host: IHostView): VirtualElement {
  const text = limitsText(host.limits);
  const use = limitsUse(host);
  const reserve = host.context_reserve_mib
    ? ` The ${formatMiB(host.context_reserve_mib)} CUDA context reserve of each kernel is not counted.`
    : '';
  return h.div(
    {
      className: `${C}-host-limits${use?.full ? ` ${C}-sev-text-warn` : ''}`
    },
    text
      ? `Your limits: ${text}.${use ? ` ${use.text}` : ''}${reserve}`
      : 'No per-user limits apply to you.'
  );
}

function table(
  cls: string,
  head: string[],
  rows: VirtualElement[]
): VirtualElement {
  return h.table(
    { className: `${C}-table ${C}-${cls}` },
    h.thead(h.tr(...head.map(t => h.th(t)))),
    h.tbody(...rows)
  );
}

function usersTable(host: IHostView): VirtualElement {
  const users = host.users ?? [];
  const total = usersTotal(users);
  return table(
    'users',
    ['User', 'Kernels', 'Reserved'],
    [
      ...users.map(u =>
        h.tr(
          {
            className: u.user === host.user ? `${C}-host-me` : '',
            dataset: { user: u.user },
            title: `${u.user}: quotas ${formatMiB(u.quota_mib)} + CUDA context = ${formatMiB(u.reserved_mib)} reserved`
          },
          h.td(
            { className: `${C}-table-name`, title: u.user },
            u.user === host.user ? `${u.user} (you)` : u.user
          ),
          h.td(String(u.kernels)),
          h.td(formatMiB(u.reserved_mib))
        )
      ),
      h.tr(
        { className: `${C}-table-total` },
        h.td('all'),
        h.td(String(total.kernels)),
        h.td(formatMiB(total.reserved_mib))
      )
    ]
  );
}

/** Every kernel, grouped by user (a group row each): kernel, card, quota, age. */
function kernelsTable(
  host: IHostView,
  props: IHostSectionProps
): VirtualElement {
  const known = new Map(
    (props.snapshot.state?.kernels ?? []).map(k => [k.kernel_id, k])
  );
  const rows = hostKernelRows(host, id => {
    const k = known.get(id);
    return k ? props.nameOf(k) : null;
  });
  const out: VirtualElement[] = [];
  rows.forEach((r, i) => {
    if (i === 0 || rows[i - 1].user !== r.user) {
      out.push(
        h.tr(
          {
            className: `${C}-table-group${r.mine ? ` ${C}-host-me` : ''}`,
            dataset: { user: r.user }
          },
          h.td(
            { colspan: '4' },
            r.user === host.user ? `${r.user} (you)` : r.user
          )
        )
      );
    }
    out.push(
      h.tr(
        {
          dataset: { kernelId: r.kernelId, user: r.user },
          title: `${r.user}’s ${r.title}`
        },
        h.td({ className: `${C}-table-name`, title: r.name }, r.name),
        h.td({ title: r.card }, r.card),
        h.td(r.quota),
        h.td(r.age)
      )
    );
  });
  return table('host-kernels', ['Kernel', 'GPU', 'Quota', 'Age'], out);
}

function body(host: IHostView, props: IHostSectionProps): VirtualElement[] {
  const out: VirtualElement[] = [];
  if (host.cards.length === 0) {
    out.push(h.div({ className: `${C}-empty` }, 'No GPU on this host.'));
  } else {
    out.push(
      h.div(
        { className: `${C}-host-cards` },
        ...host.cards.map(c => hostCard(c))
      )
    );
  }
  out.push(limits(host));
  if (host.admin) {
    const users = host.users ?? [];
    out.push(
      h.div(
        { className: `${C}-subtitle` },
        `Users (${users.length}) · you see every user’s kernels as an admin`
      ),
      users.length
        ? usersTable(host)
        : h.div(
            { className: `${C}-empty` },
            'No user holds GPU memory on this host.'
          ),
      h.div(
        { className: `${C}-subtitle` },
        `Kernels on this host (${host.kernels.length})`
      ),
      ...(host.kernels.length ? [kernelsTable(host, props)] : [])
    );
  } else {
    out.push(
      h.div(
        { className: `${C}-host-private` },
        'Other users are shown only as totals per card: their names, kernels and notebooks are private.'
      )
    );
  }
  out.push(
    h.div(
      { className: `${C}-subtitle` },
      `Waiting on this host (${host.queue.length})`
    )
  );
  if (host.queue.length) {
    out.push(
      h.ol(
        { className: `${C}-host-queue` },
        ...host.queue.map(q =>
          h.li(
            {
              className: q.mine ? `${C}-host-me` : '',
              dataset: { position: String(q.position) }
            },
            queueEntryText(q)
          )
        )
      )
    );
  } else {
    out.push(
      h.div(
        { className: `${C}-empty` },
        'No kernel waits for a GPU on this host.'
      )
    );
  }
  return out;
}

function hostError(err: IModelError): VirtualElement {
  return err.kind === 'missing'
    ? notice(
        'error',
        'This server has no host view',
        'It does not answer /api/gpushare/host (404): its jupyter-gpushare does not match this sidebar.'
      )
    : notice('error', 'The host view is unavailable', err.message, 'Retrying…');
}

/** The "This host" section: a toggle, and while open the host view (or why there is none). */
export function renderHostSection(props: IHostSectionProps): VirtualElement {
  const { snapshot, open } = props;
  const host = snapshot.host;
  const content: VirtualElement[] = [];
  if (open) {
    if (snapshot.hostError) {
      content.push(hostError(snapshot.hostError));
    } else if (host) {
      content.push(...body(host, props));
    } else {
      content.push(h.div({ className: `${C}-loading` }, 'Loading…'));
    }
  }
  return h.div(
    {
      className: `${C}-host`,
      dataset: {
        open: String(open),
        view: host ? (host.admin ? 'admin' : 'student') : 'none'
      }
    },
    h.button(
      {
        className: `${C}-host-toggle ${C}-section-title`,
        'aria-expanded': String(open),
        title: open
          ? 'Hide the host view'
          : 'Show every reservation on this host (read only while shown)',
        onclick: () => props.toggle()
      },
      h.span({ className: `${C}-caret` }, open ? '▾' : '▸'),
      'This host',
      ...(open && host?.admin
        ? [h.span({ className: `${C}-badge ${C}-sev-info` }, 'admin')]
        : [])
    ),
    ...(open
      ? [h.div({ className: `${C}-host-body`, role: 'region' }, ...content)]
      : [])
  );
}
