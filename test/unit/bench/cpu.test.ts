/**
 * bench/run.ts: the CPU per GB column counts the whole machine's busy time, so the kernel paths
 * (softirq work) have a figure as the userspace ones do.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { machineCpuSeconds } from '../../../bench/run.js';

test('machine CPU: user, nice, system, irq, softirq and steal of every CPU; not idle or iowait', () => {
  const stat = [
    //     user nice system idle  iowait irq softirq steal guest guest_nice
    'cpu  1000 20   300    90000 700    40  500     60    100   0',
    'cpu0 500  10   150    45000 350    20  250     30    50    0',
    'intr 12345',
  ].join('\n');
  assert.equal(machineCpuSeconds(stat), (1000 + 20 + 300 + 40 + 500 + 60) / 100);
});

test('machine CPU rises on this machine while a process spins', () => {
  const before = machineCpuSeconds();
  const until = process.cpuUsage().user + 200_000; // 0.2 s of this process's own CPU
  while (process.cpuUsage().user < until);
  assert.ok(machineCpuSeconds() - before >= 0.15);
});
