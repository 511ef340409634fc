// Admin operations for the integration tests, through Kafka's own Java Admin client (the jars in
// .tools/kafka/libs), so tests can set up and inspect a broker without the code under test.
// Kafka's command-line tools (TopicCommand, ConsumerGroupCommand) live in the kafka-tools
// artifact, which the broker's POM does not bring; this file is the part of them the tests need.
//
//   java -cp '.tools/kafka/libs/*' tests/java/KafkaAdmin.java BOOTSTRAP create-topic NAME PARTITIONS
//   java -cp '.tools/kafka/libs/*' tests/java/KafkaAdmin.java BOOTSTRAP delete-group GROUP
//   java -cp '.tools/kafka/libs/*' tests/java/KafkaAdmin.java BOOTSTRAP describe-group GROUP
//   java -cp '.tools/kafka/libs/*' tests/java/KafkaAdmin.java BOOTSTRAP delete-offsets GROUP TOPIC
//     (OffsetDelete of partition 0 of TOPIC in GROUP)
//   java -cp '.tools/kafka/libs/*' tests/java/KafkaAdmin.java BOOTSTRAP spread-leaders TOPIC
//     (partition i of TOPIC led by the i-th node, counting round the nodes in id order)
//
// describe-group prints one `group` line, then one `member` line per member: tab-separated
// key=value fields (ids never contain tabs). Any failure prints `error\t<exception class>\t<message>`
// on stdout and exits 1, so a test can tell "the group is not empty" from a broken helper.
// Exit 2: bad usage.

import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.stream.Collectors;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.common.ElectionType;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.ClassicGroupDescription;
import org.apache.kafka.clients.admin.MemberDescription;
import org.apache.kafka.clients.admin.NewPartitionReassignment;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.errors.ElectionNotNeededException;

public class KafkaAdmin {
    // Bounds every call: a test must fail, not hang, when the broker does not answer.
    private static final int TIMEOUT_MS = 30_000;

    public static void main(String[] args) throws Exception {
        if (args.length != 3 && !(args.length == 4
                && (args[1].equals("create-topic") || args[1].equals("delete-offsets")))) {
            usage();
        }
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, TIMEOUT_MS);
        props.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, TIMEOUT_MS);
        props.put(AdminClientConfig.CLIENT_ID_CONFIG, "kafka-lock-tests-admin");
        try (Admin admin = Admin.create(props)) {
            switch (args[1]) {
                case "create-topic" -> createTopic(admin, args[2], Integer.parseInt(args[3]));
                case "delete-group" -> admin.deleteConsumerGroups(List.of(args[2])).all()
                        .get(TIMEOUT_MS, TimeUnit.MILLISECONDS);
                case "describe-group" -> describeGroup(admin, args[2]);
                case "spread-leaders" -> spreadLeaders(admin, args[2]);
                case "delete-offsets" -> admin.deleteConsumerGroupOffsets(args[2],
                        Set.of(new TopicPartition(args[3], 0))).all()
                        .get(TIMEOUT_MS, TimeUnit.MILLISECONDS);
                default -> usage();
            }
        } catch (ExecutionException e) {
            fail(e.getCause());
        } catch (Exception e) {
            fail(e);
        }
        System.out.println("ok");
    }

    // The controller never makes a fenced node a partition's first (preferred) replica, so a
    // topic created while two of three nodes were fenced for a moment (a missed controller
    // heartbeat on a loaded machine) prefers one node for every partition, and a preferred
    // election alone cannot spread it. So: reorder each partition's replicas (the same set, the
    // chosen node first; a reassignment with nothing to copy), then elect the preferred leaders.
    // The caller waits for every replica to be in sync first: only an in-sync replica can lead.
    private static void spreadLeaders(Admin admin, String topic) throws Exception {
        List<Integer> nodes = new ArrayList<>();
        for (Node n : admin.describeCluster().nodes().get(TIMEOUT_MS, TimeUnit.MILLISECONDS)) {
            nodes.add(n.id());
        }
        nodes.sort(null);
        TopicDescription d = admin.describeTopics(List.of(topic)).allTopicNames()
                .get(TIMEOUT_MS, TimeUnit.MILLISECONDS).get(topic);
        Map<TopicPartition, Optional<NewPartitionReassignment>> moves = new HashMap<>();
        Set<TopicPartition> all = new HashSet<>();
        for (TopicPartitionInfo p : d.partitions()) {
            List<Integer> replicas = p.replicas().stream().map(Node::id)
                    .collect(Collectors.toList());
            int want = nodes.get(p.partition() % nodes.size());
            if (!replicas.contains(want)) {
                throw new IllegalStateException(topic + "-" + p.partition() + " has no replica on node "
                        + want + ": " + replicas);
            }
            List<Integer> order = new ArrayList<>(List.of(want));
            replicas.stream().filter(r -> r != want).forEach(order::add);
            TopicPartition tp = new TopicPartition(topic, p.partition());
            all.add(tp);
            if (!order.equals(replicas)) {
                moves.put(tp, Optional.of(new NewPartitionReassignment(order)));
            }
        }
        if (!moves.isEmpty()) {
            admin.alterPartitionReassignments(moves).all().get(TIMEOUT_MS, TimeUnit.MILLISECONDS);
            long deadline = System.currentTimeMillis() + TIMEOUT_MS;
            while (!admin.listPartitionReassignments(moves.keySet()).reassignments()
                    .get(TIMEOUT_MS, TimeUnit.MILLISECONDS).isEmpty()) {
                if (System.currentTimeMillis() > deadline) {
                    throw new IllegalStateException("reassignments of " + topic + " still running");
                }
                Thread.sleep(100);
            }
        }
        Map<TopicPartition, Optional<Throwable>> elected = admin
                .electLeaders(ElectionType.PREFERRED, all).partitions()
                .get(TIMEOUT_MS, TimeUnit.MILLISECONDS);
        for (Map.Entry<TopicPartition, Optional<Throwable>> e : elected.entrySet()) {
            // A partition already led by its preferred replica needs no election.
            if (e.getValue().isPresent()
                    && !(e.getValue().get() instanceof ElectionNotNeededException)) {
                throw new IllegalStateException("electing the leader of " + e.getKey() + ": "
                        + e.getValue().get());
            }
        }
    }

    private static void createTopic(Admin admin, String name, int partitions) throws Exception {
        // No replication factor: the broker's default.replication.factor, which the test support
        // sets to the cluster's size.
        NewTopic topic = new NewTopic(name, Optional.of(partitions), Optional.empty());
        admin.createTopics(List.of(topic)).all().get(TIMEOUT_MS, TimeUnit.MILLISECONDS);
    }

    // The classic-group view (DescribeGroups) rather than describeConsumerGroups: it also works
    // for groups whose protocol type is not "consumer", such as kafka-lock's native locks.
    private static void describeGroup(Admin admin, String group) throws Exception {
        ClassicGroupDescription d = admin.describeClassicGroups(List.of(group)).describedGroups()
                .get(group).get(TIMEOUT_MS, TimeUnit.MILLISECONDS);
        System.out.println(String.join("\t", "group", "id=" + d.groupId(),
                "state=" + d.state(), "protocol_type=" + d.protocol(),
                "protocol=" + d.protocolData(),
                "coordinator=" + (d.coordinator() == null ? -1 : d.coordinator().id())));
        for (MemberDescription m : d.members()) {
            String partitions = m.assignment().topicPartitions().stream()
                    .map(tp -> tp.topic() + ":" + tp.partition())
                    .sorted()
                    .collect(Collectors.joining(","));
            System.out.println(String.join("\t", "member", "member_id=" + m.consumerId(),
                    "instance_id=" + m.groupInstanceId().orElse(""),
                    "client_id=" + m.clientId(), "host=" + m.host(),
                    "partitions=" + partitions));
        }
    }

    private static void fail(Throwable e) {
        String message = String.valueOf(e.getMessage()).replace('\n', ' ').replace('\t', ' ');
        System.out.println("error\t" + e.getClass().getName() + "\t" + message);
        System.out.flush();
        System.exit(1);
    }

    private static void usage() {
        System.err.println("usage: KafkaAdmin BOOTSTRAP (create-topic NAME PARTITIONS"
                + " | delete-group GROUP | describe-group GROUP | delete-offsets GROUP TOPIC"
                + " | spread-leaders TOPIC)");
        System.exit(2);
    }
}
