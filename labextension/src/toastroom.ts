/**
 * Room at the end of the sidebar for JupyterLab's toasts, which stack at the
 * bottom right, over the right sidebar: the panel's last buttons can always be
 * scrolled above them, so no toast hides a button for as long as it is shown.
 * Measured twice a second while the panel is attached (a querySelector and two
 * rectangles), as CSS `--jp-gpushare-toast-room`.
 */
export function keepRoomForToasts(node: HTMLElement): () => void {
  const measure = () => {
    const toasts = document.querySelector(
      '.Toastify__toast-container--bottom-right'
    );
    let room = 0;
    if (toasts && toasts.childElementCount > 0) {
      const t = toasts.getBoundingClientRect();
      const p = node.getBoundingClientRect();
      if (t.left < p.right && t.right > p.left && t.top < p.bottom) {
        room = Math.ceil(p.bottom - t.top);
      }
    }
    const value = `${room}px`;
    if (node.style.getPropertyValue('--jp-gpushare-toast-room') !== value) {
      node.style.setProperty('--jp-gpushare-toast-room', value);
    }
  };
  measure();
  const timer = window.setInterval(measure, 500);
  return () => window.clearInterval(timer);
}
