// The seed design's lock, as its authors wrote it: a Java KafkaConsumer (classic group protocol)
// subscribed to a one-partition topic; whoever is assigned partition 0 holds the lock. The tests
// run it beside kafka-lock to show how the stock client behaves and to share one lock with it.
//
//   java -cp '.tools/kafka/libs/*' tests/java/SeedLockPeer.java --bootstrap HOST:PORT[,...] \
//       --group G --topic T [--client-id ID] [--session-timeout-ms 10000] \
//       [--heartbeat-interval-ms 3000] [--assignors default|cooperative-sticky]
//
// stdout, one line per event, first field the event, second System.nanoTime() (CLOCK_MONOTONIC
// on Linux HotSpot, the clock the Rust tests read; tests/it/java_peers.rs checks it):
//   STARTED <ns>                                  subscribed, before the first poll
//   ACQUIRED <ns> <generation> <member id>        partition 0 assigned
//   REVOKED <ns> <generation> <member id>         partition 0 given back (rebalance or close)
//   LOST <ns> <generation> <member id>            partition 0 lost (session expired, fenced)
//   NOW <ns>                                      answer to a `now` line on stdin
//   CLOSED <ns>                                   close() returned: LeaveGroup sent
// A line `quit` on stdin, or stdin's end, closes the consumer (LeaveGroup) and exits 0.
// Exit 2: bad usage or a topic without exactly one partition (the seed design's own pitfall:
// with more partitions several members each "hold" the lock).

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Collection;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.CooperativeStickyAssignor;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.WakeupException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public class SeedLockPeer {
    public static void main(String[] args) throws Exception {
        Map<String, String> opts = parse(args);
        String topic = opts.get("topic");
        TopicPartition lock = new TopicPartition(topic, 0);

        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, opts.get("bootstrap"));
        props.put(ConsumerConfig.GROUP_ID_CONFIG, opts.get("group"));
        props.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, "classic");
        props.put(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG,
                opts.getOrDefault("session-timeout-ms", "10000"));
        props.put(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG,
                opts.getOrDefault("heartbeat-interval-ms", "3000"));
        // The seed design's settings: no offsets to commit, polls never far apart.
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        props.put(ConsumerConfig.MAX_POLL_INTERVAL_MS_CONFIG, "600000");
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class);
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class);
        if (opts.containsKey("client-id")) {
            props.put(ConsumerConfig.CLIENT_ID_CONFIG, opts.get("client-id"));
        }
        switch (opts.getOrDefault("assignors", "default")) {
            // Java's own default, [RangeAssignor, CooperativeStickyAssignor]: left unset on
            // purpose, so the peer behaves as the seed design's consumers did.
            case "default" -> { }
            case "cooperative-sticky" -> props.put(
                    ConsumerConfig.PARTITION_ASSIGNMENT_STRATEGY_CONFIG,
                    CooperativeStickyAssignor.class.getName());
            default -> usage("--assignors must be default or cooperative-sticky");
        }

        KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(props);
        List<PartitionInfo> partitions = consumer.partitionsFor(topic, Duration.ofSeconds(30));
        if (partitions == null || partitions.size() != 1) {
            System.err.println("topic " + topic + " must exist with exactly one partition, has "
                    + (partitions == null ? 0 : partitions.size()));
            consumer.close();
            System.exit(2);
        }

        // Only the poll loop may touch the consumer; the stdin thread asks it to stop with
        // wakeup(), the one method that is safe from another thread.
        Thread stdin = new Thread(() -> {
            try (BufferedReader in = new BufferedReader(
                    new InputStreamReader(System.in, StandardCharsets.UTF_8))) {
                String line;
                while ((line = in.readLine()) != null) {
                    line = line.trim();
                    if (line.equals("quit")) {
                        break;
                    } else if (line.equals("now")) {
                        emit("NOW");
                    }
                }
            } catch (Exception e) {
                System.err.println("stdin: " + e);
            }
            stopping = true;
            consumer.wakeup();
        }, "stdin");
        stdin.setDaemon(true);

        consumer.subscribe(List.of(topic), new ConsumerRebalanceListener() {
            @Override
            public void onPartitionsAssigned(Collection<TopicPartition> parts) {
                if (parts.contains(lock)) {
                    emit("ACQUIRED", consumer);
                }
            }

            @Override
            public void onPartitionsRevoked(Collection<TopicPartition> parts) {
                if (parts.contains(lock)) {
                    emit("REVOKED", consumer);
                }
            }

            @Override
            public void onPartitionsLost(Collection<TopicPartition> parts) {
                if (parts.contains(lock)) {
                    emit("LOST", consumer);
                }
            }
        });
        emit("STARTED");
        stdin.start();
        try {
            while (!stopping) {
                consumer.poll(Duration.ofMillis(200));
            }
        } catch (WakeupException e) {
            // Asked to stop by the stdin thread.
        }
        consumer.close();
        emit("CLOSED");
        System.exit(0);
    }

    private static volatile boolean stopping = false;

    private static void emit(String event) {
        print(event + " " + System.nanoTime());
    }

    private static void emit(String event, KafkaConsumer<?, ?> consumer) {
        long now = System.nanoTime();
        var meta = consumer.groupMetadata();
        print(event + " " + now + " " + meta.generationId() + " " + meta.memberId());
    }

    // The stdin thread and the poll loop both print: one line at a time.
    private static synchronized void print(String line) {
        System.out.println(line);
        System.out.flush();
    }

    private static Map<String, String> parse(String[] args) {
        Map<String, String> opts = new HashMap<>();
        for (int i = 0; i < args.length; i += 2) {
            if (!args[i].startsWith("--") || i + 1 >= args.length) {
                usage("bad argument " + args[i]);
            }
            opts.put(args[i].substring(2), args[i + 1]);
        }
        for (String required : List.of("bootstrap", "group", "topic")) {
            if (!opts.containsKey(required)) {
                usage("--" + required + " is required");
            }
        }
        return opts;
    }

    private static void usage(String why) {
        System.err.println(why + "\nusage: SeedLockPeer --bootstrap B --group G --topic T"
                + " [--client-id ID] [--session-timeout-ms MS] [--heartbeat-interval-ms MS]"
                + " [--assignors default|cooperative-sticky]");
        System.exit(2);
    }
}
