/**
 * weft's Prometheus registry (src/common/prometheus.ts): the text exposition format 0.0.4 byte
 * for byte (HELP/TYPE, escaping, label order, values), counters that only go up, label checks,
 * collect hooks; and the daemon's whole registry read back by promtool when it is installed.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { describe, test } from 'node:test';
import { Counter, Gauge, Registry, formatValue } from '../../../src/common/prometheus.js';
import { createDaemonMetrics } from '../../../src/control/metrics/metrics.js';
import { maxOpenFiles } from '../../../src/control/metrics/process-metrics.js';

describe('exposition format', () => {
  test('an unlabelled counter shows 0 before any inc, then its sum', () => {
    const r = new Registry();
    const c = new Counter({ name: 'weft_x_total', help: 'Things.', registers: [r] });
    assert.equal(
      r.metrics(),
      '# HELP weft_x_total Things.\n# TYPE weft_x_total counter\nweft_x_total 0\n',
    );
    c.inc();
    c.inc(2.5);
    assert.equal(r.metrics().split('\n')[2], 'weft_x_total 3.5');
  });

  test('a labelled family has no series until set; labels follow labelNames, not the call', () => {
    const r = new Registry();
    const g = new Gauge({ name: 'weft_g', help: 'G.', labelNames: ['b', 'a'], registers: [r] });
    assert.equal(r.metrics(), '# HELP weft_g G.\n# TYPE weft_g gauge\n');
    g.set({ a: 'x', b: 'y' }, 1);
    g.set({ b: 'z', a: 'x' }, 2);
    g.inc({ a: 'x', b: 'y' }, 4);
    g.dec({ a: 'x', b: 'z' });
    assert.deepEqual(r.metrics().split('\n').slice(2), [
      'weft_g{b="y",a="x"} 5',
      'weft_g{b="z",a="x"} 1',
      '',
    ]);
  });

  test('HELP escapes backslash and newline; label values also the double quote', () => {
    const r = new Registry();
    new Gauge({
      name: 'weft_e',
      help: 'a \\ b\nc "d"',
      labelNames: ['v'],
      registers: [r],
    }).set({ v: 'q"x\\y\nz' }, 1);
    assert.equal(
      r.metrics(),
      '# HELP weft_e a \\\\ b\\nc "d"\n# TYPE weft_e gauge\nweft_e{v="q\\"x\\\\y\\nz"} 1\n',
    );
  });

  test('values are Go floats: NaN, +Inf, -Inf, exponents', () => {
    assert.equal(formatValue(NaN), 'NaN');
    assert.equal(formatValue(Infinity), '+Inf');
    assert.equal(formatValue(-Infinity), '-Inf');
    assert.equal(formatValue(1e21), '1e+21');
    assert.equal(formatValue(-0.5), '-0.5');
  });

  test('families appear in registration order, and the content type is 0.0.4', () => {
    const r = new Registry();
    new Gauge({ name: 'weft_b', help: 'B.', registers: [r] });
    new Gauge({ name: 'weft_a', help: 'A.', registers: [r] });
    assert.deepEqual(r.metrics().match(/^# TYPE \S+/gm), ['# TYPE weft_b', '# TYPE weft_a']);
    assert.equal(r.contentType, 'text/plain; version=0.0.4; charset=utf-8');
  });
});

describe('metric rules', () => {
  test('a counter only goes up', () => {
    const c = new Counter({ name: 'weft_up_total', help: 'U.', labelNames: ['k'] });
    assert.throws(() => c.inc({ k: 'a' }, -1), /only goes up/);
    assert.throws(() => c.inc(NaN), /only goes up/);
    c.inc({ k: 'a' }, 0);
    assert.deepEqual(c.get().values, [{ labels: { k: 'a' }, value: 0 }]);
  });

  test('labels must be exactly the declared ones', () => {
    const c = new Counter({ name: 'weft_l_total', help: 'L.', labelNames: ['a', 'b'] });
    assert.throws(() => c.inc({ a: 'x' } as never), /takes labels \[a, b\], got \[a\]/);
    assert.throws(() => c.inc({ a: 'x', b: 'y', c: 'z' } as never), /takes labels/);
    const plain = new Counter({ name: 'weft_p_total', help: 'P.' });
    assert.throws(() => plain.inc({ a: 'x' }), /takes labels \[\]/);
  });

  test('invalid names and a second family of one name are refused', () => {
    assert.throws(() => new Gauge({ name: 'weft-bad', help: '' }), /invalid metric name/);
    assert.throws(
      () => new Gauge({ name: 'weft_x', help: '', labelNames: ['__r'] }),
      /invalid label/,
    );
    assert.throws(
      () => new Gauge({ name: 'weft_x', help: '', labelNames: ['a', 'a'] }),
      /repeated/,
    );
    const r = new Registry();
    new Gauge({ name: 'weft_once', help: '', registers: [r] });
    assert.throws(() => new Gauge({ name: 'weft_once', help: '', registers: [r] }), /already/);
    assert.equal(r.getSingleMetric('weft_once')?.type, 'gauge');
  });

  test('collect runs at each read with the metric as this; reset clears labelled series', () => {
    let total = 0;
    const r = new Registry();
    new Counter({
      name: 'weft_read_total',
      help: 'R.',
      labelNames: ['dir'],
      registers: [r],
      collect() {
        this.reset();
        if (total > 0) this.inc({ dir: 'tx' }, total);
      },
    });
    assert.doesNotMatch(r.metrics(), /weft_read_total\{/);
    total = 7;
    assert.match(r.metrics(), /^weft_read_total\{dir="tx"\} 7$/m);
    total = 9;
    assert.deepEqual(r.getMetricsAsJSON()[0]!.values, [{ labels: { dir: 'tx' }, value: 9 }]);
  });
});

describe("the daemon's registry", () => {
  const { registry, lease } = createDaemonMetrics();
  lease.malformed.inc({ store: 'a"b\\c' });
  lease.peers.set(3);

  test('serves the process_* families every client library does, read now', () => {
    const text = registry.metrics();
    const value = (name: string) => {
      const m = new RegExp(`^${name} (\\S+)$`, 'm').exec(text);
      assert.ok(m, `${name} missing`);
      return Number(m[1]);
    };
    assert.ok(value('process_resident_memory_bytes') > 10e6);
    assert.ok(value('process_open_fds') >= 3);
    assert.ok(value('process_max_fds') >= value('process_open_fds'));
    assert.ok(value('process_cpu_seconds_total') > 0);
    const start = value('process_start_time_seconds');
    assert.ok(Math.abs(start - (Date.now() / 1000 - process.uptime())) < 2);
    assert.ok(value('nodejs_heap_size_used_bytes') > 0);
    assert.match(text, /^weft_build_info\{version="[^"]+",node="v\d+/m);
  });

  test('the soft open-files limit is read from /proc/self/limits', () => {
    const limits =
      'Limit                     Soft Limit           Hard Limit           Units\n' +
      'Max open files            1024                 524288               files\n';
    assert.equal(maxOpenFiles(limits), 1024);
    assert.equal(maxOpenFiles(limits.replace('1024', 'unlimited')), Infinity);
    assert.equal(maxOpenFiles('Max processes 1 1 processes\n'), null);
  });

  test('promtool check metrics finds nothing to say', (t) => {
    if (spawnSync('promtool', ['--version']).error) {
      t.skip('promtool is not installed (Debian package prometheus): format not checked');
      return;
    }
    const r = spawnSync('promtool', ['check', 'metrics'], {
      input: registry.metrics(),
      encoding: 'utf8',
    });
    assert.equal(r.status, 0, r.stdout + r.stderr);
    assert.equal((r.stdout + r.stderr).trim(), '');
  });
});
