import { JupyterFrontEnd } from '@jupyterlab/application';
import {
  Dialog,
  Notification,
  showDialog,
  showErrorMessage
} from '@jupyterlab/apputils';
import { KernelAPI } from '@jupyterlab/services';
import { Widget } from '@lumino/widgets';

import { formatMiB, isMeasured, isTemporaryPath, notebookName } from './format';
import { GpuShareModel } from './model';
import { GpuShareError } from './request';
import { KernelTracker } from './tracker';
import type { HostAction, IHostTarget, IKernel } from './types';
import { say, sizeText } from './words';

/** What a person does to a kernel from the sidebar or the queued banner. */
export interface IKernelActions {
  /** The name to show for a kernel: its notebook (the server's path, which follows renames). */
  nameOf(kernel: IKernel): string;
  /** Its notebook's name, or '' while it has none (a session JupyterLab has not renamed yet). */
  notebookOf(kernel: IKernel): string;
  open(kernel: IKernel): void;
  changeQuota(kernel: IKernel): Promise<void>;
  /** Restart with the quota the server offers after an out-of-memory error (it waits if the GPU is full). */
  restartWith(kernel: IKernel, mib: number): Promise<void>;
  shutdown(kernel: IKernel): Promise<void>;
  /** Stop waiting for a GPU, after asking: the kernel leaves the line and runs on without a GPU. */
  stopWaiting(kernel: IKernel): Promise<void>;
  /**
   * After a wait that ended without a GPU: join the line again in place (the kernel and its variables stay), or,
   * where only a restart can give it a GPU, restart it in line after asking (its variables go).
   */
  joinAgain(kernel: IKernel): Promise<void>;
  refresh(): void;
  /** Open or close the "This host" section. */
  toggleHost(): void;
  /** A teacher's action on a kernel of the host, after asking why. */
  actOnHost(target: IHostTarget, action: HostAction): Promise<void>;
}

/** A size to type again as it is: "4.5 GiB" where that is exact, else whole MiB ("4291 MiB"); "" unknown. */
export function exactSize(mib: number | null | undefined): string {
  if (!isMeasured(mib)) {
    return '';
  }
  return mib < 1024 || (mib * 10) % 1024 === 0 ? formatMiB(mib) : `${mib} MiB`;
}

/** The dialog body that asks for a new quota; it keeps what was typed and says why it was not taken. */
class QuotaBody extends Widget implements Dialog.IBodyWidget<string> {
  constructor(kernel: IKernel, limits: string, value: string, problem: string) {
    super();
    this.addClass('jp-gpushare-quota-dialog');
    const p = document.createElement('p');
    p.textContent = [
      say('ui.dialog.current', {
        quota_mib: kernel.quota_mib ?? kernel.requested_quota_mib
      }),
      limits,
      say(
        kernel.state === 'standby'
          ? 'ui.dialog.first_use'
          : 'ui.dialog.restarts'
      )
    ]
      .filter(Boolean)
      .join(' ');
    this.input = document.createElement('input');
    this.input.className = 'jp-mod-styled jp-gpushare-quota-input';
    this.input.value = value;
    this.input.placeholder = say('ui.dialog.placeholder');
    this.input.setAttribute('aria-label', say('ui.dialog.input'));
    this.node.append(p, this.input);
    if (problem) {
      const why = document.createElement('p');
      why.className = 'jp-gpushare-quota-problem';
      why.id = `jp-gpushare-quota-problem-${++QuotaBody.count}`;
      why.setAttribute('role', 'alert');
      this.input.setAttribute('aria-describedby', why.id);
      why.textContent = problem;
      this.input.setAttribute('aria-invalid', 'true');
      this.node.append(why);
    }
  }
  getValue(): string {
    return this.input.value.trim();
  }
  protected onAfterAttach(): void {
    this.input.focus();
    this.input.select();
  }
  readonly input: HTMLInputElement;
  static count = 0;
}

/** A teacher's reason for an action: one line the student reads. */
class WhyBody extends Widget implements Dialog.IBodyWidget<string> {
  constructor(text: string) {
    super();
    const p = document.createElement('p');
    p.textContent = text;
    this.input = document.createElement('input');
    this.input.className = 'jp-mod-styled';
    this.input.maxLength = 200;
    this.input.setAttribute('aria-label', say('ui.teach.why'));
    this.input.placeholder = say('ui.teach.why');
    this.node.append(p, this.input);
  }
  getValue(): string {
    return this.input.value.replace(/\s+/g, ' ').trim();
  }
  readonly input: HTMLInputElement;
}

/** A teacher's action on a kernel of the host, after asking why (the safe button has the focus). */
export async function actOnHost(
  model: GpuShareModel,
  target: IHostTarget,
  action: HostAction
): Promise<void> {
  const result = await showDialog({
    title: say(`ui.teach.${action}.title`, { name: target.name }),
    body: new WhyBody(say(`ui.teach.${action}.body`, { user: target.user })),
    buttons: [
      Dialog.cancelButton(),
      Dialog.warnButton({ label: say(`ui.teach.${action}.button`) })
    ],
    defaultButton: 0
  });
  if (!result.button.accept) {
    return;
  }
  try {
    await model.actOnHost(target.kernelId, action, result.value ?? '');
  } catch (e) {
    void showErrorMessage(say('ui.teach.failed'), (e as Error).message);
  }
}

export function kernelActions(
  app: JupyterFrontEnd,
  model: GpuShareModel,
  tracker: KernelTracker
): IKernelActions {
  const { commands, serviceManager } = app;
  /**
   * The notebook's path as JupyterLab has it now (its session follows renames),
   * else the server's; a session's temporary path only where neither has more.
   */
  const pathOf = (k: IKernel): string | null => {
    const session = [...serviceManager.sessions.running()].find(
      s => s.kernel?.id === k.kernel_id
    )?.path;
    return (
      (session && !isTemporaryPath(session) ? session : null) ??
      k.path ??
      session ??
      null
    );
  };
  /** A notebook's name, its relative path where two share a file name; '' while it has none. */
  const notebookOf = (k: IKernel) =>
    notebookName(
      pathOf(k),
      model.kernels.filter(x => x.kernel_id !== k.kernel_id).map(pathOf)
    );
  /** The notebook's name; a kernel without one by its kind. */
  const nameOf = (k: IKernel) =>
    notebookOf(k) ||
    (pathOf(k) // a session not yet renamed to its notebook's path: never its UUID
      ? say('ui.kernel.unnamed', { kernel: k.kernel_name })
      : say('ui.kernel.unnamed_id', {
          kernel: k.kernel_name,
          id: k.kernel_id.slice(0, 8)
        }));

  /** Shut a kernel down with its session, if it has one (a notebook's kernel). */
  const shutdownKernel = async (kernelId: string) => {
    const session = [...serviceManager.sessions.running()].find(
      s => s.kernel?.id === kernelId
    );
    if (session) {
      await serviceManager.sessions.shutdown(session.id);
    } else {
      await serviceManager.kernels.shutdown(kernelId);
    }
  };

  const restart = async (k: IKernel) => {
    const kernel = tracker.widgetOf(k)?.sessionContext.session?.kernel;
    if (kernel) {
      await kernel.restart();
    } else {
      await KernelAPI.restartKernel(k.kernel_id, model.serverSettings);
    }
  };

  /** Restart a kernel whose new quota the server took (it waits in line if the GPU has no room). */
  const restartWithQuota = (
    k: IKernel,
    quotaMib: number | null | undefined
  ) => {
    Notification.info(
      say('ui.quota.restarting', { name: nameOf(k), quota_mib: quotaMib }),
      {
        autoClose: 5000
      }
    );
    restart(k)
      .then(() => model.refresh())
      .catch(e =>
        Notification.error(
          say('ui.restart.failed', {
            name: nameOf(k),
            message: (e as Error).message ?? String(e)
          }),
          { autoClose: false }
        )
      );
    void model.refresh();
  };

  /** The quota the server took, in its figures (what "4.5 gb" became: MiB, said by formatMiB). */
  const taken = (k: IKernel): number | null | undefined => k.pending_quota_mib;

  /**
   * Ask until the server takes the quota typed, or the person cancels. The server is the one parser of
   * sizes and the judge of the limits: what was typed goes to it as typed, and its reason comes back.
   */
  const askQuota = async (k: IKernel): Promise<number | null | undefined> => {
    const cfg = model.snapshot.state?.config;
    const limits = [
      cfg?.min_quota
        ? say('ui.dialog.at_least', { size: sizeText(cfg.min_quota) })
        : '',
      cfg?.max_quota
        ? say('ui.dialog.at_most', { size: sizeText(cfg.max_quota) })
        : ''
    ]
      .filter(Boolean)
      .join(say('ui.dialog.and'));
    let value = exactSize(
      k.pending_quota_mib ?? k.quota_mib ?? k.requested_quota_mib
    );
    let problem = '';
    for (;;) {
      const result = await showDialog({
        title: say('ui.dialog.title', { name: nameOf(k) }),
        body: new QuotaBody(
          k,
          limits ? say('ui.dialog.limits', { limits }) : '',
          value,
          problem
        ),
        buttons: [
          Dialog.cancelButton(),
          Dialog.warnButton({
            ...(k.state === 'standby' // it holds no GPU yet: nothing restarts
              ? {
                  label: say('ui.dialog.set'),
                  ariaLabel: say('ui.dialog.set_label', { name: nameOf(k) })
                }
              : {
                  label: say('ui.dialog.restart'),
                  ariaLabel: say('ui.dialog.restart_label', {
                    name: nameOf(k)
                  })
                })
          })
        ],
        focusNodeSelector: 'input'
      });
      if (!result.button.accept) {
        return null;
      }
      value = result.value ?? '';
      try {
        return taken(await model.requestQuota(k.kernel_id, value));
      } catch (e) {
        problem = (e as Error).message; // the server's reason (not a size, a limit, the minimum): ask again
      }
    }
  };

  return {
    nameOf,
    notebookOf,
    open: k => {
      if (k.path) {
        void commands.execute('docmanager:open', { path: k.path });
      }
    },
    changeQuota: async k => {
      const quota = await askQuota(k);
      if (quota !== null && k.state === 'standby') {
        Notification.info(
          say('ui.quota.at_first_use', { name: nameOf(k), quota_mib: quota }),
          { autoClose: 5000 }
        );
        void model.refresh();
      } else if (quota !== null) {
        restartWithQuota(k, quota);
      }
    },
    restartWith: async (k, mib) => {
      // Asked first, as Change quota does: the restart loses the kernel's state. Where it stands: whether its
      // card has the extra the larger quota needs (the server reserves it at once, or refuses).
      const card = model.snapshot.state?.cards.find(
        c => c.uuid === k.card?.uuid
      );
      const extra = mib - (k.quota_mib ?? 0);
      const where =
        !card || extra <= 0
          ? ''
          : extra <= card.unreserved_mib
            ? say('ui.retry.fits', { extra_mib: extra })
            : say('ui.retry.short', {
                extra_mib: extra,
                free_mib: card.unreserved_mib
              });
      const asked = await showDialog({
        title: say('ui.retry.title', { name: nameOf(k), quota_mib: mib }),
        body: [say('ui.retry.body', { name: nameOf(k) }), where]
          .filter(Boolean)
          .join(' '),
        buttons: [
          Dialog.cancelButton(),
          Dialog.warnButton({
            label: say('ui.btn.retry', { quota_mib: mib }),
            ariaLabel: say('ui.btn.retry_label', {
              name: nameOf(k),
              quota_mib: mib
            })
          })
        ],
        defaultButton: 0 // the safe one: Enter keeps the kernel's state
      });
      if (!asked.button.accept) {
        return;
      }
      let got: IKernel;
      try {
        got = await model.requestQuota(k.kernel_id, `${mib}MiB`);
      } catch (e) {
        void showErrorMessage(
          say('ui.dialog.not_changed'),
          (e as Error).message
        );
        return;
      }
      restartWithQuota(k, taken(got));
    },
    shutdown: async k => {
      const result = await showDialog({
        title: say('ui.shutdown.title', { name: nameOf(k) }),
        body: say('ui.shutdown.body'),
        buttons: [
          Dialog.cancelButton(),
          Dialog.warnButton({ label: say('ui.btn.shutdown') })
        ],
        defaultButton: 0 // the safe one
      });
      if (!result.button.accept) {
        return;
      }
      try {
        await shutdownKernel(k.kernel_id);
      } catch (e) {
        void showErrorMessage(
          say('ui.shutdown.failed', { name: nameOf(k) }),
          (e as Error).message
        );
      }
      void model.refresh();
    },
    stopWaiting: async k => {
      const result = await showDialog({
        title: say('ui.stop.title'),
        body: say('ui.stop.body', { name: nameOf(k) }),
        buttons: [
          Dialog.cancelButton({ label: say('ui.stop.keep') }),
          Dialog.warnButton({ label: say('ui.stop.button') })
        ],
        defaultButton: 0 // the safe one: Enter, Enter keeps the kernel in line
      });
      if (!result.button.accept) {
        return;
      }
      // The kernel stays (its variables too) and runs on without a GPU; the banner then offers to join again.
      try {
        await model.stopWaiting(k.kernel_id);
      } catch (e) {
        void showErrorMessage(say('ui.stop.failed'), (e as Error).message);
      }
    },
    joinAgain: async k => {
      // In place where the kernel can (its variables kept); else, after asking, a restart in line
      let why: string;
      try {
        await model.joinAgain(k.kernel_id);
        return;
      } catch (e) {
        const code = (e as GpuShareError).code;
        if (code !== 'join-needs-restart' && code !== 'join-cannot') {
          void showErrorMessage(say('ui.join.failed'), (e as Error).message);
          return;
        }
        why = (e as Error).message;
      }
      const result = await showDialog({
        title: say('ui.join.title'),
        body: `${why} ${say('ui.join.body', { name: nameOf(k) })}`,
        buttons: [
          Dialog.cancelButton(),
          Dialog.warnButton({ label: say('ui.join.restart') })
        ],
        defaultButton: 0
      });
      if (!result.button.accept) {
        return;
      }
      try {
        await restart(k);
      } catch (e) {
        void showErrorMessage(say('ui.join.failed'), (e as Error).message);
      }
      void model.refresh();
    },
    refresh: () => void model.refresh(),
    actOnHost: (target, action) => actOnHost(model, target, action),
    toggleHost: () => {
      model.hostOpen = !model.hostOpen;
      remember(HOST_OPEN_KEY, model.hostOpen);
    }
  };
}

/** localStorage key: the "This host" section was left open (per browser). */
export const HOST_OPEN_KEY = 'jupyter-gpushare:host-open';

export function remembered(key: string): boolean {
  try {
    return window.localStorage.getItem(key) === 'true';
  } catch {
    return false; // storage disabled: start closed
  }
}

function remember(key: string, value: boolean): void {
  try {
    window.localStorage.setItem(key, String(value));
  } catch {
    // storage disabled or full: the section just starts closed next time
  }
}
