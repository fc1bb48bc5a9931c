/**
 * JSON-lines logging on stderr (pino). One root logger per process; components take a child
 * with a `component` field. Messages are short lowercase event phrases with structured fields;
 * nothing is logged per packet.
 */
import { pino, type Logger, type LevelWithSilent } from 'pino';

export type { Logger };

/** The levels `--log-level` and WEFT_LOG_LEVEL take, most severe first. */
export const LOG_LEVELS = [
  'fatal',
  'error',
  'warn',
  'info',
  'debug',
  'trace',
  'silent',
] as const satisfies readonly LevelWithSilent[];

/** `--log-format`: one JSON object per line (the default), or plain text for a terminal. */
export const LOG_FORMATS = ['json', 'text'] as const;
export type LogFormat = (typeof LOG_FORMATS)[number];

let format: LogFormat = 'json';
const stderr = pino.destination({ fd: 2, sync: true });

/**
 * One JSON log line as text: `<time> <LEVEL> [<component>] <msg> key=value …` (strings with
 * spaces or quotes JSON-quoted, objects as JSON).
 */
export function textLine(json: string): string {
  let o: Record<string, unknown>;
  try {
    o = JSON.parse(json) as Record<string, unknown>;
  } catch {
    return json;
  }
  const { time, level, component, msg, pid: _pid, ...rest } = o;
  const value = (v: unknown): string =>
    typeof v === 'string' && /^[^\s"=]+$/.test(v) ? v : JSON.stringify(v);
  const fields = Object.entries(rest).map(([k, v]) => `${k}=${value(v)}`);
  const head = [String(time), String(level).toUpperCase().padEnd(5)];
  if (component !== undefined) head.push(`[${String(component)}]`);
  return [...head, String(msg ?? ''), ...fields].join(' ') + '\n';
}

let root: Logger = pino(
  {
    level: process.env.WEFT_LOG_LEVEL ?? 'info',
    base: { pid: process.pid },
    timestamp: pino.stdTimeFunctions.isoTime,
    formatters: { level: (label) => ({ level: label }) },
  },
  { write: (line: string) => stderr.write(format === 'json' ? line : textLine(line)) },
);

export function setLogFormat(f: LogFormat): void {
  format = f;
}

export function isLogLevel(level: string): level is LevelWithSilent {
  return (LOG_LEVELS as readonly string[]).includes(level);
}

/** flanneld's klog `-v` as a level: 0 info, 1–4 debug, 5 and above trace. */
export function verbosityLevel(v: number): LevelWithSilent {
  return v <= 0 ? 'info' : v < 5 ? 'debug' : 'trace';
}

export function setLogLevel(level: LevelWithSilent): void {
  root.level = level;
}

/** Replace the root logger (tests capture logs this way). */
export function setRootLogger(logger: Logger): void {
  root = logger;
}

export function logger(component?: string): Logger {
  return component ? root.child({ component }) : root;
}

/**
 * Logs a recurring problem once per key, so a malformed lease or annotation from another node
 * is reported when first seen, not on every watch event. Counting stays with the caller.
 */
export class LogOnce {
  readonly #seen = new Set<string>();
  readonly #limit: number;

  constructor(limit = 10_000) {
    this.#limit = limit;
  }

  /** Returns true the first time `key` is seen (and the caller should log). */
  first(key: string): boolean {
    if (this.#seen.has(key)) return false;
    if (this.#seen.size >= this.#limit) this.#seen.clear();
    this.#seen.add(key);
    return true;
  }

  forget(key: string): void {
    this.#seen.delete(key);
  }
}
