/*
 * weft-tun: opens a TUN device for a parent process that cannot (Node has no ioctl), then relays
 * its packets over stdin/stdout. It is the js engine's way to a TUN when the native addon does
 * not load. Dependency-free: C99, libc and the Linux headers only.
 *
 *   usage: weft-tun NAME
 *
 * Protocol (pipes to the parent):
 *   stdout  first line: the kernel's device name and '\n'; then one frame per packet read from
 *           the TUN: a 2-byte big-endian length (1..65535) and the raw IP packet (IFF_NO_PI).
 *   stdin   frames in the same format; each one is written to the TUN as one packet.
 *   stderr  one line saying why, before a non-zero exit.
 *
 * Exit: 0 when stdin reaches EOF (the parent is gone or closed it); 1 on a TUN or pipe error or
 * a bad frame from stdin (length 0, or stdin ends inside a frame); 2 on a usage error.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#define FRAME_HDR 2
#define MAX_PACKET 65535

static unsigned char in_buf[FRAME_HDR + MAX_PACKET];  /* stdin → TUN, one frame being read */
static unsigned char out_buf[FRAME_HDR + MAX_PACKET]; /* TUN → stdout, one frame */

static int fail(const char* what) {
  fprintf(stderr, "weft-tun: %s: %s\n", what, strerror(errno));
  return 1;
}

/* Writes all of buf (a blocking pipe may take it in pieces). */
static int write_all(int fd, const unsigned char* buf, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, buf, len);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    buf += n;
    len -= (size_t)n;
  }
  return 0;
}

static int open_tun(const char* name, char* actual) {
  int fd = open("/dev/net/tun", O_RDWR | O_CLOEXEC);
  if (fd < 0) return -1;
  struct ifreq ifr;
  memset(&ifr, 0, sizeof ifr);
  ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
  strncpy(ifr.ifr_name, name, IFNAMSIZ - 1);
  if (ioctl(fd, TUNSETIFF, &ifr) < 0) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  memcpy(actual, ifr.ifr_name, IFNAMSIZ);
  actual[IFNAMSIZ - 1] = '\0';
  return fd;
}

int main(int argc, char** argv) {
  if (argc != 2 || argv[1][0] == '\0' || strlen(argv[1]) >= IFNAMSIZ) {
    fprintf(stderr, "usage: weft-tun NAME (NAME: 1..%d characters)\n", IFNAMSIZ - 1);
    return 2;
  }
  signal(SIGPIPE, SIG_IGN); /* a gone parent shows up as EPIPE / EOF, not a signal */

  char name[IFNAMSIZ];
  int tun = open_tun(argv[1], name);
  if (tun < 0) return fail("open /dev/net/tun");
  char line[IFNAMSIZ + 1];
  int len = snprintf(line, sizeof line, "%s\n", name);
  if (write_all(STDOUT_FILENO, (unsigned char*)line, (size_t)len) < 0) return fail("stdout");

  size_t have = 0; /* bytes of the current stdin frame read so far */
  struct pollfd fds[2] = {{.fd = tun, .events = POLLIN}, {.fd = STDIN_FILENO, .events = POLLIN}};
  for (;;) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return fail("poll");
    }
    if (fds[0].revents & (POLLERR | POLLNVAL)) {
      fprintf(stderr, "weft-tun: %s: device error\n", name);
      return 1;
    }
    if (fds[0].revents & POLLIN) {
      ssize_t n = read(tun, out_buf + FRAME_HDR, MAX_PACKET);
      if (n < 0 && errno != EINTR && errno != EAGAIN) return fail("read tun");
      if (n > 0) {
        out_buf[0] = (unsigned char)(n >> 8);
        out_buf[1] = (unsigned char)(n & 0xff);
        if (write_all(STDOUT_FILENO, out_buf, FRAME_HDR + (size_t)n) < 0) return fail("stdout");
      }
    }
    if (fds[1].revents & (POLLIN | POLLHUP | POLLERR)) {
      /* Read what this frame still needs: the header, then the packet it announces. */
      size_t want = FRAME_HDR;
      if (have >= FRAME_HDR) want += ((size_t)in_buf[0] << 8) | in_buf[1];
      ssize_t n = read(STDIN_FILENO, in_buf + have, want - have);
      if (n < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        return fail("read stdin");
      }
      if (n == 0) {
        if (have == 0) return 0; /* clean EOF between frames */
        fprintf(stderr, "weft-tun: stdin ended inside a frame (%zu of %zu bytes)\n", have, want);
        return 1;
      }
      have += (size_t)n;
      if (have == FRAME_HDR) {
        size_t plen = ((size_t)in_buf[0] << 8) | in_buf[1];
        if (plen == 0) {
          fprintf(stderr, "weft-tun: bad frame from stdin: length 0\n");
          return 1;
        }
      } else if (have > FRAME_HDR && have == want) {
        /* A packet the kernel refuses (not IP, device down) is dropped, not fatal: said once.
         * EBADFD means the device is gone. */
        if (write(tun, in_buf + FRAME_HDR, have - FRAME_HDR) < 0) {
          static int warned;
          if (errno == EBADFD) return fail("write tun");
          if (!warned++) fprintf(stderr, "weft-tun: write tun: %s (dropped)\n", strerror(errno));
        }
        have = 0;
      }
    }
  }
}
