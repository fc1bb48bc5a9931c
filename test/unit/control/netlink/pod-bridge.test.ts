/**
 * PodBridgeFollower over FakeNetlink feeding the bpf engine's BridgeBypass (the addon's two calls
 * recorded): ports enslaved to and released from the bridge named, and the MACs its FDB learns
 * behind them, reach the engine's port table from netlink changes alone.
 *
 *   FakeNetlink: pods0 (bridge) ─ vethA, vethB        cni0 (another bridge) ─ vethC
 *        │ watch (link / fdb changes), listBridgePorts
 *   PodBridgeFollower('pods0') ──setPodBridge──▶ BridgeBypass ──▶ bpfAttachBridge / bpfSetPorts
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { logger } from '../../../../src/common/log.js';
import { FakeNetlink } from '../../../../src/control/netlink/fake-netlink.js';
import { PodBridgeFollower } from '../../../../src/control/netlink/pod-bridge.js';
import { BridgeBypass } from '../../../../src/dataplane/bpf-engine.js';

const log = logger('test');
log.level = 'silent';

const MAC_A = '0a:58:0a:05:01:02';
const MAC_B = '0a:58:0a:05:01:03';
const MAC_C = '0a:58:0a:05:01:04';

/** The kernel's notifications come on a later turn (FakeNetlink.notify: setImmediate). */
const delivered = () => new Promise((r) => setImmediate(r));

function setup() {
  const nl = new FakeNetlink();
  const bridge = nl.addLink('pods0', { kind: 'bridge' });
  const other = nl.addLink('cni0', { kind: 'bridge' });
  const a = nl.addLink('vethA', { kind: 'veth' });
  const b = nl.addLink('vethB', { kind: 'veth' });
  const c = nl.addLink('vethC', { kind: 'veth' });
  const attached: Array<string | number> = [];
  const bpf = {
    bpfAttachBridge(_id: number, name: string | number): number {
      attached.push(name);
      return name === 0 ? 0 : (nl.links.get(String(name))?.index ?? 0);
    },
    bpfSetPorts() {},
  };
  const engine = new BridgeBypass(bpf, 1, log);
  const follower = new PodBridgeFollower(nl, 'pods0', log);
  const dp = { setPodBridge: (s: Parameters<BridgeBypass['set']>[0]) => engine.set(s) };
  return { nl, bridge, other, a, b, c, engine, follower, dp, attached };
}

test('the bridge and its ports at start: attached by the name given, MACs behind ports', async () => {
  const t = setup();
  t.nl.enslave('vethA', 'pods0');
  t.nl.learn(MAC_A, 'vethA');
  t.nl.enslave('vethC', 'cni0');
  t.nl.learn(MAC_C, 'vethC');
  await delivered();
  t.follower.feed(t.dp);
  await delivered();
  assert.deepEqual(t.attached, ['pods0']);
  assert.deepEqual(t.engine.bridge, { name: 'pods0', index: t.bridge.index });
  assert.deepEqual([...t.engine.ports], [[MAC_A, t.a.index]]);
  t.follower.close();
});

test('a port enslaved after start: the MAC learnt behind it enters the engine table', async () => {
  const t = setup();
  t.follower.feed(t.dp);
  await delivered();
  assert.deepEqual([...t.engine.ports], []);
  t.nl.enslave('vethB', 'pods0');
  t.nl.learn(MAC_B, 'vethB');
  await delivered();
  assert.deepEqual([...t.engine.ports], [[MAC_B, t.b.index]]);
  // a port of another bridge is not ours
  t.nl.enslave('vethC', 'cni0');
  t.nl.learn(MAC_C, 'vethC');
  await delivered();
  assert.deepEqual([...t.engine.ports], [[MAC_B, t.b.index]]);
  t.follower.close();
});

test('a port released: its MACs leave the engine table, the others stay', async () => {
  const t = setup();
  t.nl.enslave('vethA', 'pods0');
  t.nl.enslave('vethB', 'pods0');
  t.nl.learn(MAC_A, 'vethA');
  t.nl.learn(MAC_B, 'vethB');
  t.follower.feed(t.dp);
  await delivered();
  assert.equal(t.engine.ports.size, 2);
  t.nl.enslave('vethA', null);
  await delivered();
  assert.deepEqual([...t.engine.ports], [[MAC_B, t.b.index]]);
  // and a port deleted
  t.nl.removeLink('vethB');
  await delivered();
  assert.deepEqual([...t.engine.ports], []);
  t.follower.close();
});

test('a MAC moved to another port or aged out follows the FDB', async () => {
  const t = setup();
  t.nl.enslave('vethA', 'pods0');
  t.nl.enslave('vethB', 'pods0');
  t.follower.feed(t.dp);
  t.nl.learn(MAC_A, 'vethA');
  await delivered();
  assert.deepEqual([...t.engine.ports], [[MAC_A, t.a.index]]);
  t.nl.learn(MAC_A, 'vethB');
  await delivered();
  assert.deepEqual([...t.engine.ports], [[MAC_A, t.b.index]]);
  t.nl.forget(MAC_A);
  await delivered();
  assert.deepEqual([...t.engine.ports], []);
  t.follower.close();
});

test('the bridge removed detaches; made again, it is read whole and attached again', async () => {
  const t = setup();
  t.nl.enslave('vethA', 'pods0');
  t.nl.learn(MAC_A, 'vethA');
  t.follower.feed(t.dp);
  await delivered();
  t.nl.removeLink('pods0');
  await delivered();
  assert.equal(t.engine.bridge, null);
  assert.deepEqual([...t.engine.ports], []);
  const again = t.nl.addLink('pods0', { kind: 'bridge' });
  t.nl.enslave('vethA', 'pods0');
  t.nl.learn(MAC_A, 'vethA');
  t.nl.notify([
    { kind: 'link', deleted: false, dev: 'pods0', up: true, index: again.index, master: 0 },
  ]);
  await delivered();
  await delivered();
  assert.deepEqual(t.attached, ['pods0', 0, 'pods0']);
  assert.deepEqual(t.engine.bridge, { name: 'pods0', index: again.index });
  assert.deepEqual([...t.engine.ports], [[MAC_A, t.a.index]]);
  t.follower.close();
});

test('notifications lost (overflow): the bridge is read whole again', async () => {
  const t = setup();
  t.follower.feed(t.dp);
  await delivered();
  // changed behind the watch: only an overflow tells
  t.nl.links.get('vethA')!.master = t.bridge.index;
  t.nl.bridgeFdb.set(MAC_A, 'vethA');
  t.nl.notify([], true);
  await delivered();
  await delivered();
  assert.deepEqual([...t.engine.ports], [[MAC_A, t.a.index]]);
  t.follower.close();
});

test('a closed follower watches nothing and hands nothing more over', async () => {
  const t = setup();
  t.follower.feed(t.dp);
  await delivered();
  t.follower.close();
  assert.equal(t.nl.watchers, 0);
  t.nl.enslave('vethA', 'pods0');
  t.nl.learn(MAC_A, 'vethA');
  await delivered();
  assert.deepEqual([...t.engine.ports], []);
});

test('an engine without a bridge bypass opens no watch', () => {
  const t = setup();
  t.follower.feed({});
  assert.equal(t.nl.watchers, 0);
  t.follower.close();
});
