/**
 * Small virtual-DOM pieces shared by the panel's sections: the class prefix,
 * card headings, capacity bars and notices.
 */
import { h, VirtualElement } from '@lumino/virtualdom';
import { cardLabel } from './format';

/** The CSS class prefix of every element of the panel. */
export const C = 'jp-gpushare';

/** A card's heading: "GPU <index> · <name>" (or "GPU 0 MIG 3 · …") and its size. */
export function cardHead(
  card: { index: number; label?: string; name: string },
  total: string
): VirtualElement {
  return h.div(
    { className: `${C}-card-head` },
    h.span(
      { className: `${C}-card-name` },
      `${cardLabel(card)} · ${card.name}`
    ),
    h.span({ className: `${C}-card-total` }, total)
  );
}

/** A horizontal bar of segments, each a share of `totalMiB`, with a tooltip; `label` is what a screen reader says. */
export function bar(
  segments: { cls: string; mib: number; title: string }[],
  totalMiB: number,
  extra?: VirtualElement | VirtualElement[],
  label?: string
): VirtualElement {
  const total = Math.max(1, totalMiB);
  const extras = extra ? (Array.isArray(extra) ? extra : [extra]) : [];
  return h.div(
    {
      className: `${C}-bar`,
      role: 'img',
      'aria-label':
        label ??
        segments
          .filter(s => s.mib > 0)
          .map(s => s.title)
          .join('; ')
    },
    ...segments
      .filter(s => s.mib > 0)
      .map(s =>
        h.div({
          className: `${C}-seg ${C}-seg-${s.cls}`,
          title: s.title,
          style: {
            width: `${Math.min(100, (100 * s.mib) / total).toFixed(2)}%`
          }
        })
      ),
    ...extras
  );
}

/** A boxed message: a title and paragraphs (or elements). */
export function notice(
  cls: string,
  title: string,
  ...body: (string | VirtualElement)[]
): VirtualElement {
  return h.div(
    { className: `${C}-notice ${C}-notice-${cls}` },
    h.div({ className: `${C}-notice-title` }, title),
    ...body.map(b => (typeof b === 'string' ? h.p(b) : b))
  );
}
