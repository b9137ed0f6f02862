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
  kernelWho,
  limitsText,
  limitsUse,
  queueEntryText,
  queueWho,
  usersTotal,
  type NameOf
} from './host';
import type { IModelError, ISnapshot } from './model';
import type {
  HostAction,
  IHostCard,
  IHostTarget,
  IHostView,
  IKernel
} from './types';
import { say, segmentText, segmentTitle } from './words';

/** What the section needs from the panel. */
export interface IHostSectionProps {
  snapshot: ISnapshot;
  open: boolean;
  toggle(): void;
  /** The name (notebook) of a kernel this server runs. */
  nameOf(kernel: IKernel): string;
  /** An admin's action on a kernel of the host (asks why first). */
  act(target: IHostTarget, action: HostAction): void;
}

/** An admin's action button (the panel's small styled button). */
function actButton(
  props: IHostSectionProps,
  target: IHostTarget,
  action: HostAction
): VirtualElement {
  const label = say(`ui.teach.${action}.button`);
  return h.button(
    {
      className: `jp-Button jp-mod-styled jp-mod-small ${C}-host-act`,
      dataset: { action },
      'aria-label': say('ui.teach.label', { action: label, name: target.name }),
      onclick: () => props.act(target, action)
    },
    label
  );
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
      segs.map(s => ({ cls: s.key, mib: s.mib, title: segmentTitle(s, true) })),
      card.total_mib
    ),
    h.div(
      { className: `${C}-legend` },
      ...segs
        .filter(s => s.mib > 0 || (s.key !== 'headroom' && s.key !== 'over'))
        .map(s =>
          h.span(
            {
              className: `${C}-legend-item ${C}-host-${s.key}`,
              title: segmentTitle(s, true)
            },
            h.span({ className: `${C}-swatch ${C}-seg-${s.key}` }),
            segmentText(s, true)
          )
        )
    )
  );
}

function limits(host: IHostView): VirtualElement {
  const text = limitsText(host.limits);
  const use = limitsUse(host);
  const reserve = host.context_reserve_mib
    ? say('ui.host.reserve', { reserve_mib: host.context_reserve_mib })
    : '';
  return h.div(
    {
      className: `${C}-host-limits${use?.full ? ` ${C}-sev-text-warn` : ''}`
    },
    text
      ? [say('ui.host.limits', { limits: text }), use?.text ?? '', reserve]
          .filter(Boolean)
          .join(' ')
      : say('ui.host.no_limits')
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
    [
      say('ui.host.th.user'),
      say('ui.host.th.kernels'),
      say('ui.host.th.reserved')
    ],
    [
      ...users.map(u =>
        h.tr(
          {
            className: u.user === host.user ? `${C}-host-me` : '',
            dataset: { user: u.user },
            title: say('ui.host.user_title', {
              user: u.user,
              quota_mib: u.quota_mib,
              reserved_mib: u.reserved_mib
            })
          },
          h.td(
            { className: `${C}-table-name`, title: u.user },
            u.user === host.user ? say('ui.host.you', { user: u.user }) : u.user
          ),
          h.td(String(u.kernels)),
          h.td(formatMiB(u.reserved_mib))
        )
      ),
      h.tr(
        { className: `${C}-table-total` },
        h.td(say('ui.host.all')),
        h.td(String(total.kernels)),
        h.td(formatMiB(total.reserved_mib))
      )
    ]
  );
}

/** The name of a kernel this server runs, by its id (others: null). */
function namesOf(props: IHostSectionProps): NameOf {
  const known = new Map(
    (props.snapshot.state?.kernels ?? []).map(k => [k.kernel_id, k])
  );
  return id => {
    const k = known.get(id);
    return k ? props.nameOf(k) : null;
  };
}

/** Every kernel, grouped by user (a group row each): kernel, card, quota, age. */
function kernelsTable(
  host: IHostView,
  props: IHostSectionProps
): VirtualElement {
  const rows = hostKernelRows(host, namesOf(props));
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
            r.user === host.user ? say('ui.host.you', { user: r.user }) : r.user
          )
        )
      );
    }
    out.push(
      h.tr(
        {
          dataset: { kernelId: r.kernelId, user: r.user },
          title: say('ui.host.kernel_title', { user: r.user, title: r.title })
        },
        h.td({ className: `${C}-table-name`, title: r.name }, r.name),
        h.td({ title: r.card }, r.card),
        h.td(r.quota),
        h.td(r.age)
      ),
      // the admin's action on it, on a line of its own (the table is as narrow as the sidebar)
      h.tr(
        { className: `${C}-host-act-row` },
        h.td(
          { colspan: '4' },
          actButton(
            props,
            { kernelId: r.kernelId, name: kernelWho(r), user: r.user },
            'release'
          )
        )
      )
    );
  });
  return table(
    'host-kernels',
    [
      say('ui.host.th.kernel'),
      say('ui.host.th.gpu'),
      say('ui.host.th.quota'),
      say('ui.host.th.age')
    ],
    out
  );
}

function body(host: IHostView, props: IHostSectionProps): VirtualElement[] {
  const out: VirtualElement[] = [];
  if (host.cards.length === 0) {
    out.push(h.div({ className: `${C}-empty` }, say('ui.host.no_gpu')));
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
        say('ui.host.users', { n: users.length })
      ),
      users.length
        ? usersTable(host)
        : h.div({ className: `${C}-empty` }, say('ui.host.no_users')),
      h.div(
        { className: `${C}-subtitle` },
        say('ui.host.kernels', { n: host.kernels.length })
      ),
      ...(host.kernels.length ? [kernelsTable(host, props)] : [])
    );
  } else {
    out.push(h.div({ className: `${C}-host-private` }, say('ui.host.private')));
  }
  out.push(
    h.div(
      { className: `${C}-subtitle` },
      say('ui.host.waiting', { n: host.queue.length })
    )
  );
  if (host.queue.length) {
    const notebooks = namesOf(props);
    out.push(
      h.ol(
        { className: `${C}-host-queue` },
        ...host.queue.map(q => {
          const target =
            host.admin && q.kernel_id
              ? {
                  kernelId: q.kernel_id,
                  name: queueWho({ ...q, need_mib: null }, notebooks), // (its size is said beside it)
                  user: q.user ?? host.user
                }
              : null;
          return h.li(
            {
              key: q.kernel_id ?? undefined, // a focused button stays with its kernel when the line moves
              className: q.mine ? `${C}-host-me` : '',
              dataset: { position: String(q.position) }
            },
            queueEntryText(q, notebooks),
            ...(target
              ? [
                  h.span(
                    { className: `${C}-host-acts` },
                    ...(q.position > 1
                      ? [actButton(props, target, 'front')]
                      : []),
                    actButton(props, target, 'remove')
                  )
                ]
              : [])
          );
        })
      )
    );
  } else {
    out.push(h.div({ className: `${C}-empty` }, say('ui.host.no_waiting')));
  }
  return out;
}

function hostError(err: IModelError): VirtualElement {
  return err.kind === 'missing'
    ? notice('error', say('ui.host.missing.title'), say('ui.host.missing.body'))
    : notice(
        'error',
        say('ui.host.unavailable'),
        err.message,
        say('ui.retrying')
      );
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
      content.push(h.div({ className: `${C}-loading` }, say('ui.loading')));
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
        title: say(open ? 'ui.host.hide' : 'ui.host.show'),
        onclick: () => props.toggle()
      },
      h.span({ className: `${C}-caret` }, open ? '▾' : '▸'),
      say('ui.host.title'),
      ...(open && host?.admin
        ? [
            h.span(
              { className: `${C}-badge ${C}-sev-info` },
              say('ui.host.admin')
            )
          ]
        : [])
    ),
    ...(open
      ? [h.div({ className: `${C}-host-body`, role: 'region' }, ...content)]
      : [])
  );
}
