"""Publishing: records and declarations in, Markdown pages, snippets and SVG plots under docs/ out. Never imports
lab.measure; imports and runs on a CPU."""
