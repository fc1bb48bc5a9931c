/**
 * The standard process_* families (the names every Prometheus client library exports) and a few
 * nodejs_* ones, read at scrape time from process.* and /proc/self (Linux). Nothing runs
 * between scrapes: no timers, no event-loop or GC observers.
 */
import { readFileSync, readdirSync } from 'node:fs';
import { Counter, Gauge, type Registry } from '../../common/prometheus.js';

/** A `Vm*:  N kB` line of /proc/self/status, in bytes (0 when absent). */
function statusBytes(status: string, field: string): number {
  const m = new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(status);
  return m ? Number(m[1]) * 1024 : 0;
}

/** The soft `Max open files` limit from /proc/self/limits (Infinity when unlimited). */
export function maxOpenFiles(limits: string): number | null {
  const m = /^Max open files\s+(\S+)/m.exec(limits);
  if (!m) return null;
  return m[1] === 'unlimited' ? Infinity : Number(m[1]);
}

export function registerProcessMetrics(registry: Registry): void {
  const registers = [registry];
  const cpu = (name: string, help: string, pick: (u: NodeJS.CpuUsage) => number) =>
    new Counter({
      name,
      help,
      registers,
      collect() {
        this.reset();
        this.inc(pick(process.cpuUsage()) / 1e6);
      },
    });
  cpu('process_cpu_user_seconds_total', 'Total user CPU time spent in seconds.', (u) => u.user);
  cpu(
    'process_cpu_system_seconds_total',
    'Total system CPU time spent in seconds.',
    (u) => u.system,
  );
  cpu(
    'process_cpu_seconds_total',
    'Total user and system CPU time spent in seconds.',
    (u) => u.user + u.system,
  );
  new Gauge({
    name: 'process_start_time_seconds',
    help: 'Start time of the process since unix epoch in seconds.',
    registers,
  }).set(Math.round(Date.now() / 1000 - process.uptime()));
  new Gauge({
    name: 'process_resident_memory_bytes',
    help: 'Resident memory size in bytes.',
    registers,
    collect() {
      this.set(process.memoryUsage.rss());
    },
  });
  const status = (name: string, help: string, field: string) =>
    new Gauge({
      name,
      help,
      registers,
      collect() {
        this.set(statusBytes(readFileSync('/proc/self/status', 'utf8'), field));
      },
    });
  status('process_virtual_memory_bytes', 'Virtual memory size in bytes.', 'VmSize');
  status('process_heap_bytes', 'Process heap size (data segment) in bytes.', 'VmData');
  new Gauge({
    name: 'process_open_fds',
    help: 'Number of open file descriptors.',
    registers,
    collect() {
      // out of fds (EMFILE) the directory cannot be opened: keep the last count
      try {
        this.set(readdirSync('/proc/self/fd').length - 1); // less the directory's own fd
      } catch {
        /* keep the last value */
      }
    },
  });
  new Gauge({
    name: 'process_max_fds',
    help: 'Maximum number of open file descriptors.',
    registers,
    collect() {
      const n = maxOpenFiles(readFileSync('/proc/self/limits', 'utf8'));
      if (n !== null) this.set(n);
    },
  });
  const heap = (name: string, help: string, pick: (m: NodeJS.MemoryUsage) => number) =>
    new Gauge({
      name,
      help,
      registers,
      collect() {
        this.set(pick(process.memoryUsage()));
      },
    });
  heap(
    'nodejs_heap_size_total_bytes',
    'Process heap size from Node.js in bytes.',
    (m) => m.heapTotal,
  );
  heap(
    'nodejs_heap_size_used_bytes',
    'Process heap size used from Node.js in bytes.',
    (m) => m.heapUsed,
  );
  heap('nodejs_external_memory_bytes', 'Node.js external memory size in bytes.', (m) => m.external);
  const [major, minor, patch] = process.versions.node.split('.');
  new Gauge({
    name: 'nodejs_version_info',
    help: 'Node.js version info.',
    labelNames: ['version', 'major', 'minor', 'patch'],
    registers,
  }).set({ version: process.version, major: major!, minor: minor!, patch: patch! }, 1);
}
