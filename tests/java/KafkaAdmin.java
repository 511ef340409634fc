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
//
// describe-group prints one `group` line, then one `member` line per member: tab-separated
// key=value fields (ids never contain tabs). Any failure prints `error\t<exception class>\t<message>`
// on stdout and exits 1, so a test can tell "the group is not empty" from a broken helper.
// Exit 2: bad usage.

import java.util.List;
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
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.common.TopicPartition;

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
                // Every partition back to its preferred (first) replica; a partition already
                // led by it answers ELECTION_NOT_NEEDED, which is no failure here.
                case "elect-preferred" -> admin.electLeaders(ElectionType.PREFERRED, null)
                        .partitions().get(TIMEOUT_MS, TimeUnit.MILLISECONDS);
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
                + " | elect-preferred all)");
        System.exit(2);
    }
}
