/**
 * The words of the sidebar, worded once: every sentence the server judges is a
 * code with figures (jupyter_gpushare/core/words.py, whose English catalogue this one
 * must match: tests/server/test_contract.py checks it), worded here through
 * JupyterLab's translator, so a translation changes the panel, the banner, the
 * status bar and the notifications at once.
 *
 * A template names its figures in braces; a part in square brackets is said only
 * when every figure in it is known. Figures named `*_mib` are sizes, `*_s`
 * times. No JupyterLab import at run time: the node tests use it as is.
 */
import type { TranslationBundle } from '@jupyterlab/translation';

import type { ISegment } from './types';

type Bundle = Pick<TranslationBundle, '__'>;

const ENGLISH: Bundle = { __: (msgid: string) => msgid };

/** The catalogue, each entry through the translator (literal msgids, for extraction). */
function catalogue(trans: Bundle): { [code: string]: string } {
  const __ = (msgid: string) => trans.__(msgid);
  return {
    'status.queued.label': __('#{position} in line'),
    'status.queued.detail': __(
      'Waiting for a GPU: #{position} in line, needs {need_mib}[; {free_mib} unreserved now][; gives up at {gives_up_at}].[ Likely granted by {likely_at}, from how long kernels here held the GPU before.] CPU cells run now; a cell that uses the GPU waits for it and goes on by itself when a kernel frees room.'
    ),
    'status.standby.label': __('GPU at first use'),
    'status.standby.detail': __(
      'Holds no GPU now: its next cell that uses the GPU asks for one[ (a {requested_quota_mib} quota)] and waits its turn if the card is full. CPU cells run now.'
    ),
    'status.parked.label': __('parked'),
    'status.parked.detail': __(
      'Parked while others needed the GPU: its {parked_mib} of GPU state waits in host memory, and its {reserved_mib} reservation went to the line. Your next cell brings it back (it may wait its turn).'
    ),
    'status.over_quota.label': __('over quota'),
    'status.over_quota.detail': __(
      'Uses {used_mib}: more than its {reserved_mib} reservation (quota {quota_mib} + {reserve_mib} for the CUDA context). Free memory (del large arrays, or restart) or ask for a larger quota.'
    ),
    'status.near_quota.label': __('near quota'),
    'status.near_quota.detail': __(
      'Uses {used_mib} of its {reserved_mib} reservation (quota {quota_mib} + {reserve_mib} for the CUDA context)[ ({share_pct}%)]: the next large allocation may fail. Free memory or ask for a larger quota.'
    ),
    'status.idle.label': __('idle'),
    'status.idle.detail': __(
      'Holds {reserved_mib} of GPU memory without using the GPU. Shut it down to give the memory back to others.'
    ),
    'status.running.label': __('running'),
    'status.running.detail': __(
      'Uses {used_mib} of its {reserved_mib} reservation (quota {quota_mib} + {reserve_mib} for the CUDA context).'
    ),
    'status.running_unmeasured.label': __('running'),
    'status.running_unmeasured.detail': __(
      'Holds its {reserved_mib} reservation (quota {quota_mib} + {reserve_mib} for the CUDA context); use not measured yet.'
    ),
    'status.starting.label': __('starting'),
    'status.starting.detail': __('Reserving GPU memory for this kernel…'),
    'status.cpu.label': __('no GPU'),
    'status.cpu.detail': __('Started without a GPU.[ {reason}]'),
    'status.wait_ended.label': __('no GPU'),
    'status.wait_ended.detail': __(
      '{reason} Its cells run on without a GPU. Join again to wait for one: the kernel keeps its variables, unless it ran a GPU framework without the GPU meanwhile (then it restarts in line).'
    ),
    'status.none.label': __('no GPU'),
    'status.none.detail': __(
      'This kind of kernel reserves no GPU memory, so it sees no GPU.[ {reason}]'
    ),
    'status.failed.label': __('not running'),
    'status.failed.detail': __('The kernel could not start again.[ {reason}]'),
    'event.queued': __(
      'Waiting for a GPU: #{position} in line, needs {need_mib}.'
    ),
    'event.admitted': __('GPU ready after waiting {waited_s}.'),
    'event.parked': __(
      'Parked: {parked_mib} moved to host memory in {park_s}; its reservation went to the line until its next cell.'
    ),
    'event.park-failed': __('Could not be parked, and runs on: {reason}'),
    'event.stood-by': __(
      'Gave its {reserved_mib} GPU reservation to the line, unused for {held_s} while others waited. Its next GPU use asks again.'
    ),
    'event.teacher-front': __(
      '{by} moved it to the front of the line[: {why}]. It is served first where it fits.'
    ),
    'event.teacher-remove': __(
      '{by} took it out of the line[: {why}]. Its cells run on without a GPU.'
    ),
    'event.teacher-release': __('{by} gave its GPU reservation back[: {why}].'),
    'event.teacher-release-parked': __(
      '{by} gave its GPU reservation back[: {why}]. It is parked, its state kept: its next cell asks for a GPU again.'
    ),
    'event.teacher-release-restarted': __(
      '{by} gave its GPU reservation back[: {why}]. It was restarted and waits for a GPU again; its variables are lost.'
    ),
    'event.resumed': __(
      'Back on its GPU after {waited_s} in line; its state came back in {resume_s}.'
    ),
    'event.resume-waited-out': __(
      'Still parked: no reservation came in time[ ({reason})]. Retried while a cell runs.'
    ),
    'event.resume-no-room': __(
      'Still parked: {free_mib} free on its card, {parked_mib} needed (used outside the line). Retried while a cell runs.'
    ),
    'event.resume-failed': __(
      'Its GPU state could not be brought back ({reason}); the kernel was shut down.'
    ),
    'event.cancelled': __('Stopped waiting for a GPU[ ({why})].'),
    'event.refused': __('Not started: {reason}'),
    'event.refused-no-room': __(
      'Not started: it needs {need_mib}, and the most unreserved on any card is {free_mib}.'
    ),
    'event.refused-timeout': __(
      'Stopped waiting[ after {waited_s}]: it needs {need_mib}, and the most unreserved on any card is {free_mib}.'
    ),
    'event.refused-closing': __(
      'Not started: the Jupyter server is shutting down.'
    ),
    'event.cancelled-unwatched': __(
      'Stopped waiting for a GPU: nothing was connected to it for {unwatched_s}.'
    ),
    'event.refused-quota-below-min': __(
      'Not started: its quota {quota_mib} is below the minimum here, {least_mib}.'
    ),
    'event.refused-quota-above-max': __(
      'Not started: its quota {quota_mib} is above the maximum here, {most_mib}.'
    ),
    'event.refused-quota-unfit': __(
      'Not started: its quota {quota_mib} fits on no card; the most is {most_mib}.'
    ),
    'event.refused-user-max-kernel': __(
      'Not started: one kernel of yours may hold at most {limit_mib}; it asks for {quota_mib}.'
    ),
    'event.refused-user-max-kernels': __(
      'Not started: you may run at most {max_kernels} GPU kernels at once.'
    ),
    'event.refused-user-max-kernels.one': __(
      'Not started: you may run only {max_kernels} GPU kernel at a time.'
    ),
    'event.refused-level-below-required': __(
      'Not started: this host holds kernels at enforcement level {level}, and the admin requires {required}.'
    ),
    'event.refused-taken-out': __(
      'No GPU: {by} took it out of the line[: {why}]. It may join again in {wait_s}.'
    ),
    'event.refused-user-max-total': __(
      'Not started: your kernels hold {held_mib} of your {limit_mib}; it asks for {quota_mib}.'
    ),
    'event.no-gpu-none': __(
      'Started without a GPU: this server has none[ ({reason})].'
    ),
    'event.no-gpu-ledger': __(
      'Started without a GPU: no GPU memory can be reserved now. The GPU panel says why.'
    ),
    'event.no-gpu-full': __(
      'Started without a GPU: it needs {need_mib}, and the most unreserved on any card is {free_mib}.'
    ),
    'event.action-failed-interrupt': __(
      'Could not interrupt it; the server log says why.'
    ),
    'event.action-failed-restart': __(
      'Could not restart it; the server log says why.'
    ),
    'event.action-failed-shutdown': __(
      'Could not shut it down; the server log says why.'
    ),
    'event.refused-user-max-waiting': __(
      'Not started: you already have {waiting} kernels waiting for a GPU, the most allowed.'
    ),
    'event.refused-user-max-waiting.one': __(
      'Not started: you already have {waiting} kernel waiting for a GPU, the most allowed.'
    ),
    'event.near-quota': __(
      'Uses {used_mib} of its {reserved_mib} reservation ({share_pct}%): free memory or ask for a larger quota.'
    ),
    'event.over-quota': __(
      'Uses {used_mib}, more than its {reserved_mib} reservation: free memory or ask for a larger quota.'
    ),
    'event.over-quota-then-protect': __(
      'Uses {used_mib}, over its {reserved_mib} reservation: what holds the excess is stopped in {grace_s}. Free memory.'
    ),
    'event.over-quota-then-interrupt': __(
      'Uses {used_mib}, over its {reserved_mib} reservation: it is interrupted if still over in {grace_s}.'
    ),
    'event.over-quota-then-restart': __(
      'Uses {used_mib}, over its {reserved_mib} reservation: it is restarted if still over in {grace_s}.'
    ),
    'event.over-quota-then-shutdown': __(
      'Uses {used_mib}, over its {reserved_mib} reservation: it is shut down if still over in {grace_s}.'
    ),
    'event.over-quota-then-theft': __(
      'Uses {used_mib}: {stolen_mib} of it other kernels had reserved, so it is stopped at once.'
    ),
    'event.idle': __(
      'Holds {reserved_mib} of GPU memory unused for {idle_s}: shut it down when you are done.'
    ),
    'event.idle-then-shutdown': __(
      'Holds {reserved_mib} of GPU memory unused for {idle_s}: it is shut down in {delay_s} unless it runs something.'
    ),
    'event.out-of-memory': __(
      '{framework} ran out of GPU memory at quota {quota_mib}: restart with {retry_mib} to run it with more.'
    ),
    'event.quota-at-first-use': __(
      'Quota {quota_mib} requested; it applies at the first GPU use, without a restart.'
    ),
    'event.quota-requested': __(
      'Quota {quota_mib} requested; it applies at the next restart.'
    ),
    'event.quota-applied': __(
      'Restarted with its new quota, {quota_mib} ({reserved_mib} reserved).'
    ),
    'event.quota-kept': __(
      'Quota {quota_mib} was not applied; it keeps {kept_mib}: {why}'
    ),
    'event.over-quota-notify': __(
      'Still over its {reserved_mib} reservation after {over_s}: free memory or ask for a larger quota.'
    ),
    'event.over-quota-interrupt': __(
      'Interrupted: it used {used_mib}, over its {reserved_mib} reservation[, for {over_s}]. Free memory or ask for a larger quota.'
    ),
    'event.over-quota-restart': __(
      'Restarted: it used {used_mib}, over its {reserved_mib} reservation[, for {over_s}]. Ask for a larger quota, then run it again.'
    ),
    'event.over-quota-restart-theft': __(
      'Restarted at once: it took {stolen_mib} of GPU memory other kernels had reserved. Ask for a larger quota.'
    ),
    'event.over-quota-stop': __(
      'Ended {processes} processes it started, which took it to {used_mib}, over its {reserved_mib} reservation. It runs on.'
    ),
    'event.over-quota-stop.one': __(
      'Ended {processes} process it started, which took it to {used_mib}, over its {reserved_mib} reservation. It runs on.'
    ),
    'event.over-quota-stop-theft': __(
      'Ended {processes} processes it started, which took {stolen_mib} other kernels had reserved. It runs on.'
    ),
    'event.over-quota-stop-theft.one': __(
      'Ended {processes} process it started, which took {stolen_mib} other kernels had reserved. It runs on.'
    ),
    'event.over-quota-shutdown': __(
      'Shut down: it used {used_mib}, over its {reserved_mib} reservation[, for {over_s}].'
    ),
    'event.idle-shutdown': __(
      'Shut down after {idle_s} without using the GPU; its {reserved_mib} went back to the others.'
    ),
    'event.group-ended': __(
      '{processes} processes it had started were still running and were ended with it.'
    ),
    'event.group-ended.one': __(
      '{processes} process it had started was still running and was ended with it.'
    ),
    'event.reserved': __('{reserved_mib} on {card}.'),
    'event.released': __('Released {reserved_mib} ({why}).'),
    'event.reclaimed': __(
      'Reclaimed {reserved_mib} of a kernel this server no longer has.'
    ),
    'event.release-pending': __(
      'Its reservation will be given back once the ledger works: {reason}'
    ),
    'event.learned': __(
      'Quota {quota} learned from earlier runs ({learned_from}).'
    ),
    'policy.quota-below-min': __(
      'A quota of {quota_mib}[ ({share_pct}% of a card)] is less than the smallest a kernel may have here ({least_mib}). Ask for at least {least_mib}.'
    ),
    'policy.quota-above-max': __(
      'A quota[ of {quota_mib}][ ({share_pct}% of a card)] is more than the largest a kernel may have here ({most_mib}). Ask for at most {most_mib}.'
    ),
    'policy.quota-unfit': __(
      'A quota of {quota_mib}[ ({share_pct}% of a card)] does not fit on any card even when it is empty: the most a kernel can reserve here is {most_mib} plus the {reserve_mib} CUDA context reserve.'
    ),
    'policy.user-max-kernel': __(
      'You may give one kernel at most {limit_mib} of GPU memory; this one asks for {quota_mib}. Ask for at most {limit_mib}.'
    ),
    'policy.user-max-kernels': __(
      'You may run at most {max_kernels} GPU kernels at once and already run {kernels}. Shut down a kernel you no longer use, then start this one again.'
    ),
    'policy.user-max-kernels.one': __(
      'You may run only {max_kernels} GPU kernel at a time and already run {kernels}. Shut down a kernel you no longer use, then start this one again.'
    ),
    'policy.level-below-required': __(
      'This host holds kernels at enforcement level {level}, and the admin requires {required}. Ask the admin: `jupyter gpushare doctor` says what is missing.'
    ),
    'policy.user-max-total': __(
      'You may hold at most {limit_mib} of GPU memory in all your kernels together; they hold {held_mib} and this one asks for {quota_mib}. Shut down a kernel you no longer use.'
    ),
    'policy.user-max-waiting': __(
      'You have {waiting} kernels waiting for a GPU already, the most one user may have in line here. Stop waiting on one of them (the banner’s Stop waiting, or shut its kernel down), or wait until one starts.'
    ),
    'policy.user-max-waiting.one': __(
      'You have {waiting} kernel waiting for a GPU already, the most one user may have in line here. Stop waiting on it (the banner’s Stop waiting, or shut its kernel down), or wait until it starts.'
    ),
    'policy.grow-no-room': __(
      '{quota_mib} needs {extra_mib} more on GPU {card_index}, which has {free_mib} unreserved now. The kernel keeps its quota and its GPU; ask again once others have shut down, or ask for less.'
    ),
    'policy.join-needs-restart': __(
      '{frameworks} ran in this kernel without a GPU, so only a restart can give it one: the kernel restarts in line, and its variables are lost.'
    ),
    'policy.join-cannot': __(
      'This kernel cannot wait again in place (it did not wait for a GPU since its start): only a restart gives it one, and its variables are lost.'
    ),
    'policy.join-busy': __(
      'The kernel is busy: join again once its cell has finished.'
    ),
    'policy.taken-out': __(
      '{by} took this kernel out of the GPU line[: {why}]. It may join the line again in {wait_s}; until then its cells run without a GPU. Ask {by} if it needs the GPU sooner.'
    ),
    'policy.park-budget': __(
      'Its {parked_mib} of GPU state does not fit the host memory kept for parked kernels: {held_mib} of {budget_mib} is taken. It is not parked.'
    ),
    'limits.use': __('You hold {held}.'),
    'limits.total': __('{quota_mib} of {max_total_mib}'),
    'limits.kernels': __('{kernels} of {max_kernels} GPU kernels'),
    'limits.kernels.one': __('{kernels} of {max_kernels} GPU kernel'),
    'limits.and': __('{a} and {b}'),
    'segment.text': __('{label} {size_mib}'),
    'segment.mine.label': __('yours'),
    'segment.mine.title': __(
      'Yours: {size_mib} reserved by your kernels (quotas + CUDA context)'
    ),
    'segment.others.label': __('other kernels'),
    'segment.others.title': __(
      'Other kernels: {size_mib} reserved by other kernels on this host'
    ),
    'segment.other_users.label': __('other users'),
    'segment.other_users.title': __(
      'Other users: {size_mib} reserved by other users’ kernels on this host'
    ),
    'segment.over.label': __('over-use'),
    'segment.over.title': __(
      'Over-use: {size_mib} used by your kernels past their reservations; new kernels count it as taken'
    ),
    'segment.outside.label': __('no reservation'),
    'segment.outside.title': __(
      'No reservation: {size_mib} used by processes that hold no reservation; new kernels count it as taken'
    ),
    'segment.headroom.label': __('kept free'),
    'segment.headroom.title': __(
      'Kept free: {size_mib} kept free by the admin for the driver and processes outside Jupyter'
    ),
    'segment.free.label': __('unreserved'),
    'segment.free.title': __(
      'Unreserved: {size_mib} what new kernels can still reserve'
    ),
    'size.mib': __('{n} MiB'),
    'size.gib': __('{n} GiB'),
    'time.s': __('{n} s'),
    'time.min': __('{n} min'),
    'time.h': __('{n} h'),
    'time.h_min': __('{h} h {min} min')
  };
}

/**
 * The sidebar's own words (headings, buttons, tooltips): said only here, so
 * they are not in the server's catalogue ("ui." codes).
 */
function uiCatalogue(trans: Bundle): { [code: string]: string } {
  const __ = (msgid: string) => trans.__(msgid);
  return {
    'ui.title': __('GPU memory'),
    'ui.simulated': __('simulated'),
    'ui.refresh': __('Refresh GPU memory quotas now'),
    'ui.loading': __('Loading…'),
    'ui.retrying': __('Retrying…'),
    'ui.card.bar': __('{card}, {total_mib}: {parts}'),
    'ui.card.kernels': __('{n} kernels on this card'),
    'ui.card.kernels.one': __('{n} kernel on this card'),
    'ui.card.measured': __(
      'in use (measured) {usage}, utilisation {utilisation}'
    ),
    'ui.card.unmeasured': __('use not measured yet'),
    'ui.card.not_used': __('not used for new kernels'),
    'ui.bar.quota': __('quota {quota_mib}'),
    'ui.bar.reservation': __('reservation {reserved_mib}'),
    'ui.bar.peak': __('peak {peak_mib}'),
    'ui.bar.unmeasured': __(
      'use not measured yet (reservation {reserved_mib})'
    ),
    'ui.bar.using': __('using {used_mib}'),
    'ui.bar.label': __(
      'GPU memory: {label}, of a reservation of {reserved_mib} (quota {quota_mib} + CUDA context)'
    ),
    'ui.bar.title': __(
      'of its reservation: quota {quota_mib} + {reserve_mib} for the CUDA context'
    ),
    'ui.timeline.label': __(
      'GPU memory over the last {span_s}: from {from_mib} to {to_mib}, peak {peak_mib}, quota {quota_mib}'
    ),
    'ui.timeline.title': __(
      'Use over the last {span_s} (peak {peak_mib}); lines: quota {quota_mib}, reservation {reserved_mib}'
    ),
    'ui.fw.title': __('As reported by the kernel’s own processes'),
    'ui.fw.source': __('reported by the kernel:'),
    'ui.fw.detail': __('[{detail} ](reported by the kernel)'),
    'ui.fw.capped': __('{name} capped[ {limit_mib}]'),
    'ui.fw.uncapped': __('{name} not capped'),
    'ui.held': __('Held to its quota by: {level}'),
    'ui.level.caps': __('its frameworks’ caps only'),
    'ui.level.watchdog': __('a watchdog'),
    'ui.level.cgroup': __('a watchdog and its own cgroup'),
    'ui.level.allocation': __('a limit at allocation'),
    'ui.held.cgroup': __('own cgroup'),
    'ui.held.cgroup_escapable': __('own cgroup, escapable'),
    'ui.held.tree': __('process tree'),
    'ui.held.closed': __('other cards closed'),
    'ui.held.open': __('other cards not closed'),
    'ui.held.allocation': __('the driver’s limit'),
    'ui.held.watchdog': __('over quota: {action}'),
    'ui.held.title': __(
      'How the server holds this kernel: {parts}. Memory it takes from other kernels’ reservations is stopped at once; other use beyond its reservation after a grace.[ {reason}.]'
    ),
    'ui.kernel.waiting': __('waiting'),
    'ui.kernel.no_card': __('no card'),
    'ui.kernel.more': __('Details'),
    'ui.cell.gpu': __('GPU memory quota: {text}'),
    'ui.kernel.unnamed': __('{kernel} kernel'),
    'ui.kernel.unnamed_id': __('{kernel} kernel {id}'),
    'ui.kernel.quota': __('quota {quota_mib}'),
    'ui.kernel.quota_reserved': __(
      'quota {quota_mib} + {reserve_mib} CUDA context = {reserved_mib} reserved'
    ),
    'ui.kernel.pending': __('→ {quota_mib} at next restart'),
    'ui.kernel.utilisation': __('GPU utilisation {utilisation}'),
    'ui.btn.retry': __('Restart with {quota_mib}'),
    'ui.btn.retry_label': __(
      'Restart {name} with a {quota_mib} GPU quota (it ran out of memory; asks first)'
    ),
    'ui.btn.quota': __('Change quota…'),
    'ui.btn.quota_label': __('Change the GPU quota of {name} (restarts it)'),
    'ui.btn.quota_label_first_use': __(
      'Change the GPU quota of {name} (its first GPU use asks for it)'
    ),
    'ui.btn.shutdown': __('Shut down'),
    'ui.btn.shutdown_label': __('Shut down {name}'),
    'ui.open': __('Open {name}'),
    'ui.missing.title': __('The GPU quota server extension is not running'),
    'ui.missing.body': __(
      'This Jupyter server does not answer /api/gpushare/ (404). Ask the admin to install jupyter-gpushare in the server’s environment and enable it (jupyter server extension enable jupyter_gpushare), then restart Jupyter.'
    ),
    'ui.unreadable.title': __('GPU quotas cannot be read'),
    'ui.stale.title': __('Showing the last known figures'),
    'ui.nogpu.title': __('No GPU on this server'),
    'ui.nogpu.body': __('No GPU was found.'),
    'ui.nogpu.cpu': __('Notebooks run on the CPU here.'),
    'ui.simulated.title': __('Simulated card'),
    'ui.simulated.body': __(
      'These cards are simulated: quotas and queueing behave as on a real GPU, but there is no GPU memory behind them. In a notebook, gpushare_simulate.use("1.5GiB") pretends use.'
    ),
    'ui.ledger.title': __('Reservations are unavailable'),
    'ui.ledger.body': __(
      'New kernels start without a GPU until the admin fixes this.'
    ),
    'ui.queue.one': __(
      '{n} kernel waiting for a GPU on this host[ ({mine} of them yours)]'
    ),
    'ui.queue': __(
      '{n} kernels waiting for a GPU on this host[ ({mine} of them yours)]'
    ),
    'ui.noquota.title': __('This notebook’s kernel has no GPU quota'),
    'ui.nokernel.title': __('This notebook’s kernel is not started'),
    'ui.noquota.body': __(
      'The server did not give this kernel a quota (it may have started before the extension, or be shutting down).'
    ),
    'ui.nokernel.body': __(
      'Run a cell (or Kernel › Restart) to start its kernel and reserve GPU memory.'
    ),
    'ui.kernels': __('My kernels ({n})'),
    'ui.kernels.none': __(
      'No kernel holds or waits for GPU memory. Open a notebook to start one.'
    ),
    'ui.host.reserve': __(
      'The {reserve_mib} CUDA context reserve of each kernel is not counted.'
    ),
    'ui.host.limits': __('Your limits: {limits}.'),
    'ui.host.no_limits': __('No per-user limits apply to you.'),
    'ui.host.th.user': __('User'),
    'ui.host.th.kernels': __('Kernels'),
    'ui.host.th.reserved': __('Reserved'),
    'ui.host.th.kernel': __('Kernel'),
    'ui.host.th.gpu': __('GPU'),
    'ui.host.th.quota': __('Quota'),
    'ui.host.th.age': __('Age'),
    'ui.host.user_title': __(
      '{user}: quotas {quota_mib} + CUDA context = {reserved_mib} reserved'
    ),
    'ui.host.you': __('{user} (you)'),
    'ui.host.all': __('all'),
    'ui.host.kernel_title': __('{user}’s {title}'),
    'ui.host.no_gpu': __('No GPU on this host.'),
    'ui.host.users': __(
      'Users ({n}) · you see every user’s kernels as an admin'
    ),
    'ui.host.no_users': __('No user holds GPU memory on this host.'),
    'ui.host.kernels': __('Kernels on this host ({n})'),
    'ui.host.private': __(
      'Other users are shown only as totals per card: their names, kernels and notebooks are private.'
    ),
    'ui.host.waiting': __('Waiting on this host ({n})'),
    'ui.host.no_waiting': __('No kernel waits for a GPU on this host.'),
    'ui.host.missing.title': __('This server has no host view'),
    'ui.host.missing.body': __(
      'It does not answer /api/gpushare/host (404): its jupyter-gpushare does not match this sidebar.'
    ),
    'ui.host.unavailable': __('The host view is unavailable'),
    'ui.host.hide': __('Hide the host view'),
    'ui.host.show': __(
      'Show every reservation on this host (read only while shown)'
    ),
    'ui.host.title': __('This host'),
    'ui.host.admin': __('admin'),
    'ui.status.none': __('GPU memory quota of this notebook’s kernel'),
    'ui.status.title': __('{who}: {label}[ on {card}].[ {detail}]'),
    'ui.history.own': __(
      'This notebook peaked at {peak_mib} in your earlier runs.'
    ),
    'ui.history.others': __(
      'This notebook peaked at {peak_mib} when others ran it.'
    ),
    'ui.history.kind_own': __(
      'Your earlier {kernel} kernels peaked at {peak_mib}.'
    ),
    'ui.history.kind_others': __(
      'Earlier {kernel} kernels peaked at {peak_mib}.'
    ),
    'ui.history.learned': __('Its quota was learned from earlier runs.'),
    'ui.limits.total': __('{size} in total'),
    'ui.limits.kernel': __('{size} per kernel'),
    'ui.limits.count': __('{n} GPU kernels'),
    'ui.limits.count.one': __('{n} GPU kernel'),
    'ui.limits.up_to': __('up to {parts}'),
    'ui.queue.kind': __('{kernel} kernel'),
    'ui.queue.kernel': __('kernel'),
    'ui.queue.kind_id': __('{kind} {id}'),
    'ui.queue.yours': __('your {kind}[, {quota_mib}]'),
    'ui.queue.user': __('{user}’s {kind}[, {quota_mib}]'),
    'ui.queue.another': __('another user’s kernel'),
    'ui.queue.entry': __('#{position} {who} · waiting {waited_s}'),
    'ui.host.pid_hidden': __('not visible'),
    'ui.host.row': __(
      'kernel {kernel_id} ({kernel}) on {card}: quota {quota_mib} + {reserve_mib} CUDA context = {reserved_mib} reserved; server pid {server_pid}, kernel pid {kernel_pid}'
    ),
    'ui.dialog.current': __('Current quota: {quota_mib}.'),
    'ui.dialog.restarts': __(
      'The kernel restarts to apply the new quota: its variables and state will be lost. It keeps its GPU: a larger quota is reserved at once, or refused now if its GPU has not the room.'
    ),
    'ui.dialog.placeholder': __('e.g. 6GiB or 512MiB'),
    'ui.dialog.input': __('New GPU memory quota'),
    'ui.dialog.title': __('GPU quota of {name}'),
    'ui.dialog.limits': __('You may ask for {limits}.'),
    'ui.dialog.at_least': __('at least {size}'),
    'ui.dialog.at_most': __('at most {size}'),
    'ui.dialog.and': __(' and '),
    'ui.dialog.restart': __('Restart with new quota'),
    'ui.dialog.first_use': __(
      'Nothing restarts: the kernel holds no GPU yet, and its first GPU use asks for the new quota.'
    ),
    'ui.dialog.set': __('Set quota'),
    'ui.dialog.set_label': __('Set the quota of {name}'),
    'ui.dialog.restart_label': __('Restart {name} with the new quota'),
    'ui.dialog.not_changed': __('GPU quota not changed'),
    'ui.retry.title': __('Restart {name} with {quota_mib}?'),
    'ui.retry.body': __(
      '{name} ran out of GPU memory. Restarting it loses its state: its variables, imports and data in memory are gone, and its cells must run again.'
    ),
    'ui.retry.fits': __(
      'Its GPU has the {extra_mib} more it needs now: the kernel keeps its card and reserves the extra at once.'
    ),
    'ui.retry.short': __(
      'It needs {extra_mib} more on its GPU, which has {free_mib} unreserved now: the larger quota is refused until others free that much, and the kernel keeps what it has.'
    ),
    'ui.shutdown.title': __('Shut down {name}?'),
    'ui.shutdown.body': __(
      'Its variables and state will be lost, and its GPU memory goes back to the others.'
    ),
    'ui.shutdown.failed': __('{name} was not shut down'),
    'ui.teach.front.button': __('Move to front'),
    'ui.teach.remove.button': __('Take out'),
    'ui.teach.release.button': __('Release'),
    'ui.teach.front.title': __('Move {name} to the front of the line?'),
    'ui.teach.remove.title': __('Take {name} out of the line?'),
    'ui.teach.release.title': __('Give the GPU reservation of {name} back?'),
    'ui.teach.front.body': __(
      'It is served first where it fits. {user} is told, with your reason.'
    ),
    'ui.teach.remove.body': __(
      'It stops waiting and runs on without a GPU, with its variables. {user} is told, with your reason.'
    ),
    'ui.teach.release.body': __(
      'It is parked where it can be (its state kept; its next cell asks for a GPU again), else restarted (its variables lost). {user} is told, with your reason.'
    ),
    'ui.teach.why': __('Why (the student reads this)'),
    'ui.teach.label': __('{action}: {name}'),
    'ui.teach.failed': __('The action was not carried out'),
    'ui.stop.title': __('Stop waiting for a GPU?'),
    'ui.stop.keep': __('Keep waiting'),
    'ui.stop.body': __(
      '{name}’s kernel leaves the line and runs on without a GPU, with its variables; a cell waiting for the GPU stops and says so. Join again later to wait for a GPU.'
    ),
    'ui.join.title': __('Restart in line for a GPU?'),
    'ui.join.restart': __('Restart in line'),
    'ui.join.body': __(
      '{name}’s kernel restarts and waits in line for a GPU; CPU cells run meanwhile.'
    ),
    'ui.join.button': __('Join again'),
    'ui.join.failed': __('Could not join the line again'),
    'ui.join.label': __('Join again: {name} joins the line for a GPU'),
    'ui.stop.failed': __('Could not stop waiting'),
    'ui.restart.failed': __('{name} did not restart: {message}'),
    'ui.caption': __('GPU memory quotas'),
    'ui.cmd.open': __('Show GPU Memory Quotas'),
    'ui.cmd.open_caption': __(
      'Open the sidebar with each kernel’s GPU memory quota and use'
    ),
    'ui.cmd.refresh': __('Refresh GPU Memory Quotas'),
    'ui.kernel_note.queued': __('waits for a GPU, {label}'),
    'ui.kernel_note.parked': __('GPU parked'),
    'ui.statusbar.usage': __('GPU {usage}'),
    'ui.statusbar.label': __('GPU {label}'),
    'ui.statusbar.no_gpu': __('no GPU'),
    'ui.statusbar.first_use': __('GPU at first use'),
    'ui.statusbar.no_kernel': __('GPU: no kernel'),
    'ui.statusbar.unknown': __('GPU –'),
    'ui.notify.kernel': __('{name}: {text}'),
    'ui.notify.someone': __('A kernel'),
    'ui.error.unreachable': __(
      'The Jupyter server cannot be reached ({message}).'
    ),
    'ui.stop.button': __('Stop waiting'),
    'ui.stop.label': __('Stop waiting for a GPU for {name}'),
    'ui.config.rules': __(
      'Default quota {default}[, at most {max}][; each kernel also reserves {reserve_mib} for its CUDA context].'
    ),
    'ui.config.queue': __('When the GPU is full, kernels wait in line.'),
    'ui.config.cpu': __('When the GPU is full, kernels start on the CPU.'),
    'ui.config.reject': __('When the GPU is full, kernels are refused.'),
    'ui.quota.at_first_use': __(
      '{name} asks for a {quota_mib} GPU quota at its first GPU use.'
    ),
    'ui.quota.restarting': __(
      'Restarting {name} with a {quota_mib} GPU quota…'
    ),
    'ui.size.pair_mib': __('{used} / {total} MiB'),
    'ui.size.pair_gib': __('{used} / {total} GiB'),
    'ui.size.share': __('{percent}% of a card')
  };
}

let words = { ...catalogue(ENGLISH), ...uiCatalogue(ENGLISH) };

/** Word everything with this translator from now on (the plugin sets JupyterLab's at activation). */
export function setTranslator(trans: Bundle | null): void {
  words = { ...catalogue(trans ?? ENGLISH), ...uiCatalogue(trans ?? ENGLISH) };
}

/**
 * The pseudo-locale (localStorage "jupyter-gpushare:pseudo-locale" = "1", for tests
 * and translators): every translated string marked ⟦…⟧, so that text not worded
 * through the catalogue stands out. Called without a bundle: whether it is on.
 */
export function pseudoLocale(): boolean;
export function pseudoLocale(trans: Bundle): Bundle;
export function pseudoLocale(trans?: Bundle): Bundle | boolean {
  if (!trans) {
    try {
      return (
        typeof window !== 'undefined' &&
        window.localStorage?.getItem(PSEUDO_KEY) === '1'
      );
    } catch {
      return false;
    }
  }
  return { __: (msgid: string) => `⟦${trans.__(msgid)}⟧` };
}

export const PSEUDO_KEY = 'jupyter-gpushare:pseudo-locale';

type Params = { [name: string]: unknown };

function known(value: unknown): boolean {
  return value !== null && value !== undefined && value !== '';
}

/** One name per framework, wherever it is said (the server's words.FRAMEWORKS is the same). */
export const FRAMEWORK_NAMES: { [name: string]: string } = {
  cupy: 'CuPy',
  jax: 'JAX',
  tensorflow: 'TensorFlow',
  torch: 'PyTorch'
};

function figure(name: string, value: unknown): string {
  if (name === 'framework' && typeof value === 'string') {
    return FRAMEWORK_NAMES[value] ?? value;
  }
  if (typeof value === 'number' && name.endsWith('_mib')) {
    return formatMiB(value);
  }
  if (typeof value === 'number' && name.endsWith('_s')) {
    return formatDuration(value);
  }
  if (typeof value === 'number' && name.endsWith('_at')) {
    // a time of day, on this browser's clock, as the kernel says it in the cell ("gives up at 23:23")
    return new Date(value * 1000).toLocaleTimeString([], {
      hour: '2-digit',
      minute: '2-digit',
      hourCycle: 'h23'
    });
  }
  return String(value);
}

const PLACEHOLDER = /\{([a-z_]+)\}/g;

/**
 * Codes whose words change with a count: the `<code>.one` form is said when that
 * parameter is 1 (the server's words.PLURALS, the same map).
 */
export const PLURALS: Record<string, string> = {
  'event.group-ended': 'processes',
  'event.over-quota-stop': 'processes',
  'event.over-quota-stop-theft': 'processes',
  'limits.kernels': 'max_kernels',
  'event.refused-user-max-kernels': 'max_kernels',
  'policy.user-max-kernels': 'max_kernels',
  'event.refused-user-max-waiting': 'waiting',
  'policy.user-max-waiting': 'waiting',
  // the sidebar's own
  'ui.card.kernels': 'n',
  'ui.queue': 'n',
  'ui.limits.count': 'n'
};

/** Whether every figure a part of a template names is known. */
function complete(part: string, params: Params): boolean {
  return (part.match(PLACEHOLDER) ?? []).every(m =>
    known(params[m.slice(1, -1)])
  );
}

/**
 * A code's words with its figures; an unknown code says its `message`
 * parameter (the server's English), else the code. Optional parts are kept or
 * dropped first, then every figure is put in, in one pass: a figure's own text
 * (a notebook's name, what a kernel reported) is never read as a template. A
 * figure that is not known is a dash. A code in PLURALS says its `.one` form
 * when its count is 1.
 */
export function say(code: string, params: Params = {}): string {
  if (code in PLURALS && params[PLURALS[code]] === 1) {
    code = `${code}.one`;
  }
  const template = words[code];
  if (template === undefined) {
    return known(params.message) ? String(params.message) : code;
  }
  const kept = template.replace(/\[([^[\]]*)\]/g, (_, part: string) =>
    complete(part, params) ? part : ''
  );
  return kept.replace(PLACEHOLDER, (_, n: string) =>
    known(params[n]) ? figure(n, params[n]) : '–'
  );
}

/** True when a figure is a finite number (the sampler's fields may be null or absent). */
export function isMeasured(value: number | null | undefined): value is number {
  return typeof value === 'number' && isFinite(value);
}

/**
 * GiB to one decimal place, halves rounded up (15,616 MiB is 15.25 GiB: "15.3"), as the server's format_mib
 * does: the one rounding of every size the sidebar shows.
 */
function gibText(mib: number): string {
  const tenths = Math.floor((Math.abs(mib) * 10) / 1024 + 0.5);
  return ((mib < 0 && tenths ? -tenths : tenths) / 10).toFixed(1);
}

/** One decimal place, without a trailing ".0" (the server's format_mib) and never "-0". */
function decimal(mib: number): string {
  return gibText(mib).replace(/\.0$/, '');
}

/** A size for people, as the server says it: "512 MiB" below 1 GiB, else "1.5 GiB", "3 GiB"; "–" unknown. */
export function formatMiB(mib: number | null | undefined): string {
  if (!isMeasured(mib)) {
    return '–';
  }
  return Math.abs(mib) < 1024
    ? say('size.mib', { n: Math.round(mib) })
    : say('size.gib', { n: decimal(mib) });
}

/**
 * "used / total unit" with one unit chosen from the total and one decimal place
 * kept (figures side by side): "1.2 / 4.0 GiB", "– / 4.0 GiB" when use is not
 * measured, "300 / 512 MiB" for small quotas.
 */
export function formatUsage(
  usedMiB: number | null | undefined,
  totalMiB: number | null | undefined
): string {
  if (!isMeasured(totalMiB)) {
    return `${formatMiB(usedMiB)} / –`;
  }
  const gib = totalMiB >= 1024;
  const num = (x: number | null | undefined): string =>
    !isMeasured(x) ? '–' : gib ? gibText(x) : String(Math.round(x));
  return say(gib ? 'ui.size.pair_gib' : 'ui.size.pair_mib', {
    used: num(usedMiB),
    total: num(totalMiB)
  });
}

/** A size the admin set: "6 GiB", or "25% of a card" for a share; "" when none. */
export function sizeText(
  size: { mib?: number; percent?: number } | null | undefined
): string {
  if (!size) {
    return '';
  }
  return isMeasured(size.percent)
    ? say('ui.size.share', { percent: size.percent })
    : formatMiB(size.mib);
}

/** Seconds for people, as the server says them: "45 s", "3 min", "2 h 5 min" (rounded down). */
export function formatDuration(seconds: number | null | undefined): string {
  if (!isMeasured(seconds)) {
    return '–';
  }
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) {
    return say('time.s', { n: s });
  }
  if (s < 3600) {
    return say('time.min', { n: Math.floor(s / 60) });
  }
  const h = Math.floor(s / 3600);
  const min = Math.floor((s % 3600) / 60);
  return min ? say('time.h_min', { h, min }) : say('time.h', { n: h });
}

/**
 * A part of a card in words, by its key and figure ("yours 7 GiB"); in the host
 * view (`byUser`) the others' part is other users'.
 */
export function segmentText(s: ISegment, byUser = false): string {
  const key = byUser && s.key === 'others' ? 'other_users' : s.key;
  return say('segment.text', {
    label: say(`segment.${key}.label`),
    size_mib: s.mib
  });
}

/** A part's tooltip: its figure and what it is. */
export function segmentTitle(s: ISegment, byUser = false): string {
  const key = byUser && s.key === 'others' ? 'other_users' : s.key;
  return say(`segment.${key}.title`, { size_mib: s.mib });
}
