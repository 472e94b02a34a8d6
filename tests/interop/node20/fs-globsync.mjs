// `node:fs` plus a minimal globSync for Node 20 (see register.mjs). Supports what the
// conformance suite asks of it: `**/NAME`, `DIR/**/NAME` and plain relative paths, with
// `{cwd}`; `*` and `?` match within one path segment. Returns relative paths, like Node 22's.
import fs from 'node:fs';
import path from 'node:path';

export * from 'node:fs';
export default fs;

function segmentRegExp(segment) {
  const body = segment
    .split('')
    .map((c) => (c === '*' ? '[^/]*' : c === '?' ? '[^/]' : c.replace(/[.+^${}()|[\]\\]/g, '\\$&')))
    .join('');
  return new RegExp(`^${body}$`);
}

function walk(root, relative, segments, out) {
  if (segments.length === 0) {
    out.add(relative === '' ? '.' : relative);
    return;
  }
  const [head, ...rest] = segments;
  const here = path.join(root, relative);
  if (head === '**') {
    walk(root, relative, rest, out); // zero directories
    for (const entry of readDir(here)) {
      if (entry.isDirectory()) walk(root, join(relative, entry.name), segments, out);
    }
    return;
  }
  if (!/[*?]/.test(head)) {
    const next = join(relative, head);
    if (fs.existsSync(path.join(root, next))) walk(root, next, rest, out);
    return;
  }
  const re = segmentRegExp(head);
  for (const entry of readDir(here)) {
    if (re.test(entry.name) && (rest.length === 0 || entry.isDirectory())) {
      walk(root, join(relative, entry.name), rest, out);
    }
  }
}

function join(a, b) {
  return a === '' ? b : `${a}/${b}`;
}

function readDir(dir) {
  try {
    return fs.readdirSync(dir, { withFileTypes: true });
  } catch {
    return [];
  }
}

export function globSync(pattern, options = {}) {
  const cwd = options.cwd === undefined ? process.cwd() : String(options.cwd);
  const out = new Set();
  for (const p of Array.isArray(pattern) ? pattern : [pattern]) {
    const segments = p.split(/[\\/]+/).filter((s) => s !== '' && s !== '.');
    walk(cwd, '', segments, out);
  }
  return [...out];
}
