// Creates topics and writes records with Apache Kafka's own Java client, for the Apache captures
// of testdata/frames/apache/ (testdata/README.md). The pinned jars have no TopicCommand
// (kafka-tools is not among them), but the Admin and Producer APIs of kafka-clients are there.
// Run with the JDK's source launcher:
//
//   java -cp '.tools/kafka/libs/*' scripts/ApacheTopics.java create BOOTSTRAP TOPIC PARTITIONS
//   java -cp '.tools/kafka/libs/*' scripts/ApacheTopics.java produce BOOTSTRAP TOPIC CODEC COUNT
//
// `produce` sends COUNT records (key "java-<i>", value "value-<i>", header "source: java") with
// compression.type CODEC (none, gzip, snappy, lz4, zstd) in one batch, and waits for acks=all.

import java.util.List;
import java.util.Properties;
import java.util.concurrent.Future;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.serialization.StringSerializer;

public class ApacheTopics {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put("bootstrap.servers", args[1]);
        switch (args[0]) {
            case "create" -> {
                try (Admin admin = Admin.create(props)) {
                    NewTopic topic = new NewTopic(args[2], Integer.parseInt(args[3]), (short) 1);
                    admin.createTopics(List.of(topic)).all().get();
                }
                System.out.println("created " + args[2]);
            }
            case "produce" -> {
                props.put("key.serializer", StringSerializer.class.getName());
                props.put("value.serializer", StringSerializer.class.getName());
                props.put("compression.type", args[3]);
                props.put("acks", "all");
                // One batch for all records: nothing is sent before flush().
                props.put("linger.ms", "60000");
                int count = Integer.parseInt(args[4]);
                try (KafkaProducer<String, String> producer = new KafkaProducer<>(props)) {
                    Future<?>[] sent = new Future<?>[count];
                    for (int i = 0; i < count; i++) {
                        ProducerRecord<String, String> r =
                            new ProducerRecord<>(args[2], 0, "java-" + i, "value-" + i);
                        r.headers().add("source", "java".getBytes());
                        sent[i] = producer.send(r);
                    }
                    producer.flush();
                    for (Future<?> f : sent) {
                        RecordMetadata m = (RecordMetadata) f.get();
                        System.out.println(args[3] + " offset " + m.offset());
                    }
                }
            }
            default -> throw new IllegalArgumentException("create or produce");
        }
    }
}
