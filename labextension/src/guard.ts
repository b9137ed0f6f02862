/**
 * Drop late replies for a kernel that is no longer current.
 *
 * Each request takes a ticket for the kernel it asks about; when the reply
 * comes, `accept(ticket)` is true only if that kernel is still the current one
 * and no newer request for it has been answered first.
 */
export interface ITicket<K> {
  readonly key: K | null;
  readonly seq: number;
}

export class ReplyGuard<K = string> {
  private _key: K | null = null;
  private _epoch = 0;
  private _issued = 0;
  private _accepted = -1;
  private _epochOfTicket = new Map<number, number>();

  /** The kernel replies are wanted for. */
  get current(): K | null {
    return this._key;
  }

  /** Set the current kernel; tickets taken for another kernel are dropped. */
  setCurrent(key: K | null): void {
    if (key !== this._key) {
      this._key = key;
      this._epoch++;
      this._epochOfTicket.clear();
    }
  }

  /** A ticket for a request about the current kernel. */
  ticket(): ITicket<K> {
    const seq = this._issued++;
    this._epochOfTicket.set(seq, this._epoch);
    return { key: this._key, seq };
  }

  /**
   * Whether a reply is still wanted: its kernel is current, and it is not
   * older than a reply already accepted (replies may arrive out of order).
   */
  accept(ticket: ITicket<K>): boolean {
    const epoch = this._epochOfTicket.get(ticket.seq);
    this._epochOfTicket.delete(ticket.seq);
    if (epoch !== this._epoch || ticket.key !== this._key) {
      return false;
    }
    if (ticket.seq < this._accepted) {
      return false;
    }
    this._accepted = ticket.seq;
    return true;
  }
}

/**
 * Which events are new. Events come oldest first with a Unix time; the next
 * request asks `?since=` the newest time seen, and an event seen already (same
 * time, kind and kernel) is never shown twice even if the server repeats it.
 */
export class EventCursor {
  private _since = 0;
  private _seen = new Set<string>();
  private _primed = false;

  /** The value for `?since=` (seconds). */
  get since(): number {
    return this._since;
  }

  /** Whether the first batch was read. */
  get primed(): boolean {
    return this._primed;
  }

  /**
   * Take a batch; returns the events not seen before. The first batch only
   * primes the cursor (events from before the page loaded are not news),
   * unless `notifyFirst` is true.
   */
  take<E extends { time: number; kind: string; kernel_id?: string | null }>(
    events: E[],
    notifyFirst = false
  ): E[] {
    const fresh: E[] = [];
    for (const e of events) {
      const key = `${e.time}|${e.kind}|${e.kernel_id ?? ''}`;
      if (this._seen.has(key)) {
        continue;
      }
      this._seen.add(key);
      if (e.time > this._since) {
        this._since = e.time;
      }
      fresh.push(e);
    }
    if (this._seen.size > 2000) {
      // Keep memory bounded: only keys at the newest time can repeat.
      const keep = [...this._seen].filter(k => k.startsWith(`${this._since}|`));
      this._seen = new Set(keep);
    }
    const first = !this._primed;
    this._primed = true;
    return first && !notifyFirst ? [] : fresh;
  }
}
