// What the walk scripts (class-walk.js, idle-cost.js) ask of a page: its server's REST API, through the page's own
// fetch (its cookies and origin), as the page itself would ask.
const api = (page, p, init) =>
  page.evaluate(
    async ([p, init]) => {
      const r = await fetch(p, init);
      return r.status === 204 ? null : r.json();
    },
    [p, init]
  );

module.exports = { api };
