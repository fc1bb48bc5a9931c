/** iproute2's failure text mapped back to the kernel's errno (Iproute2Netlink). */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { errnoFromIpText, opArgs } from '../../../../src/control/netlink/iproute2-netlink.js';

describe('errnoFromIpText', () => {
  test('maps strerror text, extended acks and unknown messages', () => {
    assert.equal(errnoFromIpText('RTNETLINK answers: File exists\n'), 17);
    assert.equal(errnoFromIpText('RTNETLINK answers: No such process'), 3);
    assert.equal(errnoFromIpText('Error: FIB table does not exist.\nCommand failed -:1'), 3);
    assert.equal(errnoFromIpText('Cannot find device "x0"'), 19);
    assert.equal(errnoFromIpText('Device "x0" does not exist.'), 19);
    assert.equal(errnoFromIpText('Error: ipv6: address not found.'), 99);
    assert.equal(errnoFromIpText('Error: something new.'), 22);
  });
});

test("opArgs: the vxlan backend's route, neighbour and fdb ops as ip and bridge commands", () => {
  assert.deepEqual(
    opArgs({
      op: 'replaceRoute',
      dst: '10.5.1.0/24',
      gw: '10.5.1.0',
      dev: 'flannel.1',
      onlink: true,
    }),
    {
      tool: 'ip',
      args: [
        '-4',
        'route',
        'replace',
        '10.5.1.0/24',
        'via',
        '10.5.1.0',
        'dev',
        'flannel.1',
        'onlink',
        'table',
        '254',
      ],
    },
  );
  assert.deepEqual(opArgs({ op: 'delNeigh', dst: 'fd00::1', dev: 'flannel-v6.1' }), {
    tool: 'ip',
    args: ['neigh', 'del', 'fd00::1', 'dev', 'flannel-v6.1'],
  });
  assert.equal(
    opArgs({ op: 'appendFdb', mac: '0e:00:00:00:00:01', dst: '10.0.0.2', dev: 'f' }).tool,
    'bridge',
  );
});
