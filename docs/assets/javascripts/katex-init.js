// Typesets the site's math with the vendored KaTeX (docs/assets/vendor/katex), with no network.
//
// pymdownx.arithmatex (generic mode) leaves \( ... \) and \[ ... \] inside elements of class "arithmatex";
// notebook Markdown cells keep Jupyter's $ ... $ and $$ ... $$. Only those elements are scanned, so a
// dollar sign in prose or code is never taken for math. A formula KaTeX cannot parse is reported on the
// console (auto-render's default), which the browser tests treat as a failure.
(function () {
  "use strict";

  var TEX_DELIMITERS = [
    { left: "\\[", right: "\\]", display: true },
    { left: "\\(", right: "\\)", display: false },
  ];
  var NOTEBOOK_DELIMITERS = [
    { left: "$$", right: "$$", display: true },
    { left: "$", right: "$", display: false },
  ].concat(TEX_DELIMITERS);

  function typeset(root) {
    root.querySelectorAll(".arithmatex").forEach(function (el) {
      renderMathInElement(el, { delimiters: TEX_DELIMITERS });
    });
    root.querySelectorAll(".jp-RenderedMarkdown, .jp-MarkdownOutput").forEach(function (el) {
      renderMathInElement(el, { delimiters: NOTEBOOK_DELIMITERS });
    });
  }

  if (typeof document$ !== "undefined") {
    // Material's instant navigation swaps the page body without a reload: typeset every new page.
    document$.subscribe(function () { typeset(document.body); });
  } else {
    document.addEventListener("DOMContentLoaded", function () { typeset(document.body); });
  }
})();
