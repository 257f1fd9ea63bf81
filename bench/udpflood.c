/* udpflood: a bounded raw IPv4+UDP sender for bench/bench_datapath.py (compiled there at run time).
 *
 *   udpflood DST_IPV4 SECONDS MAX_PACKETS [SRC_NET [SRC_BITS]]
 *
 * Sends 46-byte IPv4+UDP packets (20 + 8 + 18 payload) to DST_IPV4 through a raw socket with IP_HDRINCL, in
 * sendmmsg batches of 64. Every packet gets a pseudo-random source address inside SRC_NET/(32 - SRC_BITS)
 * (default 198.18.0.0 with 16 random bits, i.e. 198.18.0.0/16: RFC 2544 benchmarking space, which nftblockd
 * never puts in a set), so every set lookup on the receiver misses.
 *
 * Bounded three ways: it stops after SECONDS (checked every batch), after MAX_PACKETS, and an alarm kills it
 * SECONDS + 2 s after start whatever happens. It is meant to run inside a private network namespace whose
 * only route to DST is a veth pair to another private namespace.
 *
 * Output (stdout, one line): "sent <packets> elapsed <seconds> errors <send errors> cpu <seconds>", where cpu
 * is the CPU time this process used while sending (CLOCK_PROCESS_CPUTIME_ID). With veth, the receiver's
 * netfilter path runs in softirq inside the send call, and without CONFIG_IRQ_TIME_ACCOUNTING that time is
 * charged to the sender: cpu / packets is the cost of a packet end to end, whatever else the CPU was doing
 * (time spent preempted by other processes is not in it, unlike elapsed).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/ip.h>
#include <netinet/udp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BATCH 64
#define PAYLOAD 18
#define PKT_LEN (sizeof(struct iphdr) + sizeof(struct udphdr) + PAYLOAD)

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static uint32_t xorshift32(uint32_t *s) {
    uint32_t x = *s;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return *s = x;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s DST_IPV4 SECONDS MAX_PACKETS [SRC_NET [SRC_BITS]]\n", argv[0]);
        return 2;
    }
    struct in_addr dst, src_net;
    if (inet_pton(AF_INET, argv[1], &dst) != 1) {
        fprintf(stderr, "bad destination %s\n", argv[1]);
        return 2;
    }
    double seconds = atof(argv[2]);
    unsigned long long max_packets = strtoull(argv[3], NULL, 10);
    if (inet_pton(AF_INET, argc > 4 ? argv[4] : "198.18.0.0", &src_net) != 1) {
        fprintf(stderr, "bad source network\n");
        return 2;
    }
    int src_bits = argc > 5 ? atoi(argv[5]) : 16;
    if (seconds <= 0 || seconds > 60 || src_bits < 0 || src_bits > 16) {
        fprintf(stderr, "SECONDS must be in (0, 60], SRC_BITS in [0, 16]\n");
        return 2;
    }
    alarm((unsigned)seconds + 2); /* default action: terminate, whatever the loop below does */

    int fd = socket(AF_INET, SOCK_RAW, IPPROTO_RAW);
    if (fd < 0) {
        perror("socket");
        return 1;
    }
    int one = 1;
    if (setsockopt(fd, IPPROTO_IP, IP_HDRINCL, &one, sizeof one) < 0) {
        perror("IP_HDRINCL");
        return 1;
    }

    static unsigned char pkts[BATCH][PKT_LEN];
    struct iovec iov[BATCH];
    struct mmsghdr msgs[BATCH];
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_addr = dst};
    uint32_t base = ntohl(src_net.s_addr) & ~((1u << src_bits) - 1);
    uint32_t mask = (1u << src_bits) - 1;
    memset(msgs, 0, sizeof msgs);
    for (int i = 0; i < BATCH; i++) {
        struct iphdr *ip = (struct iphdr *)pkts[i];
        struct udphdr *udp = (struct udphdr *)(pkts[i] + sizeof(struct iphdr));
        memset(pkts[i], 0, PKT_LEN);
        ip->version = 4;
        ip->ihl = 5;
        ip->tot_len = htons(PKT_LEN);
        ip->ttl = 64;
        ip->protocol = IPPROTO_UDP;
        ip->daddr = dst.s_addr; /* saddr per packet below; the kernel fills id and the header checksum */
        udp->source = htons(40000);
        udp->dest = htons(9); /* discard; the receiver drops it in netfilter anyway */
        udp->len = htons(sizeof(struct udphdr) + PAYLOAD);
        udp->check = 0; /* no UDP checksum (allowed for IPv4) */
        iov[i].iov_base = pkts[i];
        iov[i].iov_len = PKT_LEN;
        msgs[i].msg_hdr.msg_iov = &iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
        msgs[i].msg_hdr.msg_name = &to;
        msgs[i].msg_hdr.msg_namelen = sizeof to;
    }

    uint32_t rnd = 0x9E3779B9u ^ (uint32_t)getpid();
    unsigned long long sent = 0, errors = 0;
    double cpu0 = cpu_s();
    double start = now_s(), end = start + seconds, t = start;
    while (sent < max_packets) {
        int n = BATCH;
        if (max_packets - sent < (unsigned long long)n)
            n = (int)(max_packets - sent);
        for (int i = 0; i < n; i++)
            ((struct iphdr *)pkts[i])->saddr = htonl(base | (xorshift32(&rnd) & mask));
        int r = sendmmsg(fd, msgs, n, 0);
        if (r < 0) {
            if (errno != ENOBUFS && errno != EAGAIN && errno != EINTR) {
                perror("sendmmsg");
                return 1;
            }
            errors++;
        } else {
            sent += r;
        }
        t = now_s();
        if (t >= end)
            break;
    }
    printf("sent %llu elapsed %.6f errors %llu cpu %.6f\n", sent, t - start, errors, cpu_s() - cpu0);
    return 0;
}
